"""Write a tiny random-weight Llama and a locally trained BPE tokenizer (no hub access).

2 layers, hidden 128, 4 heads of 32 (full MHA), float32: about 0.5 M parameters plus
embeddings, so `vllm serve` starts in seconds on a CPU. Run with the vLLM venv's Python.
"""

import json
import random
import sys
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

out = Path(sys.argv[1])
out.mkdir(parents=True, exist_ok=True)

words = (
    "the of and to in is that for it as with was on be by at this from or an are not have has but "
    "they which one you all were we there can been more will would their if so about what when up out "
    "into time only new some could these two may then do first any like now server queue cache token "
    "latency model request batch prefill decode gpu memory kernel throughput"
).split()
rng = random.Random(0)
corpus = [" ".join(rng.choice(words) for _ in range(rng.randint(5, 40))) for _ in range(4000)]

tok = Tokenizer(models.BPE(unk_token="<unk>"))
tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
tok.decoder = decoders.ByteLevel()
trainer = trainers.BpeTrainer(
    vocab_size=2048, special_tokens=["<unk>", "<s>", "</s>"], initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
)
tok.train_from_iterator(corpus, trainer)
fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>", unk_token="<unk>")
fast.chat_template = (
    "{% for m in messages %}<s>{{ m['role'] }}\n{{ m['content'] }}</s>\n{% endfor %}"
    "{% if add_generation_prompt %}<s>assistant\n{% endif %}"
)
fast.save_pretrained(out)

cfg = LlamaConfig(
    vocab_size=len(fast),
    hidden_size=128,
    intermediate_size=256,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=4,
    max_position_embeddings=2048,
    bos_token_id=fast.bos_token_id,
    eos_token_id=fast.eos_token_id,
    tie_word_embeddings=False,
    torch_dtype="float32",
)
import torch  # noqa: E402

torch.manual_seed(0)
model = LlamaForCausalLM(cfg).to(torch.float32)
model.save_pretrained(out, safe_serialization=True)
cfg_json = json.loads((out / "config.json").read_text())
cfg_json["torch_dtype"] = "float32"
(out / "config.json").write_text(json.dumps(cfg_json, indent=2))
print(f"tiny model: {sum(p.numel() for p in model.parameters())} parameters, vocab {len(fast)} -> {out}")
