"""What a server's ``/metrics`` says: the exposition parser, the vLLM view across versions, the scrape
history, the snapshots the collectors hand out, a streamed completion read once."""
