"""The core: the domain without a terminal or a network, in sub-packages by what things are
(``metrics``, ``monitor``, ``hardware``, ``ramp``, ``tuning``, ``traces``, ``analysis``), the
shared basics at its root (errors, formatting, confidence intervals, the result files' codec), in
the order ``tests/unit/test_layers.py`` states (``CORE_ORDER``; docs/architecture.md).

Nothing in this package imports Textual, Rich or httpx, or does network I/O. Most of it is pure;
six modules read or write files, each for one reason: ``files`` (bounded reads, atomic writes),
``results`` (the result files), ``monitor.recording`` (``--record``), ``traces.read`` (a trace),
``tuning.space`` (a search space's TOML) and ``hardware.presets`` (a model's config.json).
"""
