"""Where the engine's time goes, live: achieved FLOP/s and memory traffic from vLLM's own
estimates, as a share of the GPU's peak, and a one-word reading.

vLLM (0.17 and later, V1) exports ``vllm:estimated_flops_per_gpu_total`` and
``vllm:estimated_{read,write}_bytes_per_gpu_total``: its analytic estimate of what each step
asks of one GPU. The counters are present on every V1 server but stay at zero unless the
server runs with ``--enable-mfu-metrics``; a server whose engine stepped while they did not move
reads "n/a" with that flag named, never "idle" or 0 %.

The reading (:func:`reading`), per engine and for the server (the mean over its engines, each
engine having GPUs of its own):

* **idle**: the engine made no step in the window.
* **n/a**: the server does not export the counters, they did not move although the engine
  stepped, or the GPU is unknown (absolute figures only: no peak to compare with).
* With the GPU's peaks known, ``c`` = FLOP/s ÷ peak dense BF16 FLOP/s and ``m`` = bytes/s ÷ peak
  HBM bandwidth, both averaged over the window's wall time:

  - **overhead-bound** when both are below :data:`OVERHEAD_BELOW` (a quarter of peak): the GPU
    is neither computing nor moving memory for most of the window, so the time goes to the
    scheduler, kernel launches, sampling, host-device copies or gaps between steps;
  - **memory-bound** when ``m >= c``: the steps stream weights and KV faster, relative to the
    hardware, than they do arithmetic (decode-heavy batches);
  - **compute-bound** otherwise (prefill-heavy batches, large batches).

  Comparing the two shares is the roofline model's test: the operation's arithmetic intensity
  (FLOP per byte) against the GPU's ridge point (peak FLOP/s ÷ peak bytes/s).
"""

from __future__ import annotations

from dataclasses import dataclass

from spoc_tui.core.hardware.presets import GpuSpec, gpu_for_model_name
from spoc_tui.core.metrics.vllm import EngineView

OVERHEAD_BELOW = 0.25
"""Both shares of peak below this: overhead-bound."""
MFU_FLAG = "--enable-mfu-metrics"


@dataclass(frozen=True, slots=True)
class Roofline:
    flops_s: float | None
    """Achieved FLOP/s per GPU, window mean (vLLM's estimate)."""
    bytes_s: float | None
    """Memory traffic per GPU (read + write), bytes/s, window mean."""
    steps_s: float | None
    tokens_per_step: float | None
    gpu: GpuSpec | None
    reading: str
    """idle, memory-bound, compute-bound, overhead-bound or n/a."""
    why: str
    """One short clause behind the reading (e.g. the flag to add)."""

    @property
    def intensity(self) -> float | None:
        """Arithmetic intensity, FLOP per byte."""
        if self.flops_s is None or not self.bytes_s:
            return None
        return self.flops_s / self.bytes_s

    @property
    def flops_share(self) -> float | None:
        if self.gpu is None or self.flops_s is None:
            return None
        return self.flops_s / self.gpu.bf16_flops

    @property
    def bw_share(self) -> float | None:
        if self.gpu is None or self.bytes_s is None:
            return None
        return self.bytes_s / self.gpu.mem_bw_bytes_s

    @property
    def ridge(self) -> float | None:
        """The GPU's ridge point, FLOP per byte."""
        return self.gpu.bf16_flops / self.gpu.mem_bw_bytes_s if self.gpu else None

    def as_dict(self) -> dict[str, object]:
        return {
            "flops_per_s": self.flops_s,
            "bytes_per_s": self.bytes_s,
            "flop_per_byte": self.intensity,
            "steps_per_s": self.steps_s,
            "tokens_per_step": self.tokens_per_step,
            "gpu": self.gpu.name if self.gpu else None,
            "flops_share_of_peak": self.flops_share,
            "bandwidth_share_of_peak": self.bw_share,
            "reading": self.reading,
            "why": self.why,
        }


def reading(
    flops_s: float | None,
    read_s: float | None,
    write_s: float | None,
    steps_s: float | None,
    tokens_per_step: float | None,
    gpu: GpuSpec | None,
    no_gpu: str = "GPU unknown",
) -> Roofline:
    """The roofline figures and reading of one engine (or a server's mean engine); ``None``
    inputs are metrics the server does not export (or no window yet); ``no_gpu`` says why there
    is no peak when ``gpu`` is None."""
    bytes_s = None if read_s is None and write_s is None else (read_s or 0.0) + (write_s or 0.0)

    def out(word: str, why: str, f: float | None = flops_s, b: float | None = bytes_s) -> Roofline:
        return Roofline(f, b, steps_s, tokens_per_step, gpu, word, why)

    if steps_s is not None and steps_s <= 0:
        return out("idle", "no engine step in the window")
    if flops_s is None and bytes_s is None:
        if steps_s is None:
            return out("n/a", "no FLOP or step metrics (vLLM < 0.17 or no window yet)")
        return out("n/a", "no FLOP metrics (vLLM < 0.17)")
    if not flops_s and not bytes_s:
        # the engine stepped (or we cannot tell) while the estimates stood still
        return out("n/a", f"FLOP counters at zero: start vLLM with {MFU_FLAG}", None, None)
    if gpu is None:
        return out("n/a", f"{no_gpu}: absolute figures only")
    c = (flops_s or 0.0) / gpu.bf16_flops
    m = (bytes_s or 0.0) / gpu.mem_bw_bytes_s
    if max(c, m) < OVERHEAD_BELOW:
        return out("overhead-bound", f"{c:.0%} of peak FLOP/s, {m:.0%} of peak bandwidth")
    if m >= c:
        return out("memory-bound", f"{m:.0%} of peak bandwidth, {c:.0%} of peak FLOP/s")
    return out("compute-bound", f"{c:.0%} of peak FLOP/s, {m:.0%} of peak bandwidth")


def of_view(v: EngineView, gpu: GpuSpec | None, no_gpu: str = "GPU unknown") -> Roofline:
    return reading(
        v.flops_per_gpu_rate,
        v.read_bytes_per_gpu_rate,
        v.write_bytes_per_gpu_rate,
        v.steps_rate,
        v.tokens_per_step,
        gpu,
        no_gpu,
    )


def gpu_of(model_names: list[str | None] | tuple[str | None, ...]) -> GpuSpec | None:
    """The one preset all these GPUs (NVML/DCGM model names) share, else None: a mixed or
    unknown set gives absolute figures only."""
    specs = {gpu_for_model_name(n) for n in model_names}
    if len(specs) != 1:
        return None
    return specs.pop()


def si(value: float | None, unit: str) -> str:
    """``312 TFLOP/s``, ``2.10 TB/s``: decimal SI prefixes, three significant figures."""
    if value is None:
        return "n/a"
    for factor, prefix in ((1e15, "P"), (1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(value) >= factor:
            v = value / factor
            return f"{v:.3g} {prefix}{unit}"
    return f"{value:.3g} {unit}"


def rates(r: Roofline, share: str = " ({:.0%})") -> tuple[str, str]:
    """The FLOP/s and B/s figures, each with its share of the GPU's peak where the GPU is known
    (``share`` formats it)."""
    f = si(r.flops_s, "FLOP/s") + ("" if r.flops_share is None else share.format(r.flops_share))
    b = si(r.bytes_s, "B/s") + ("" if r.bw_share is None else share.format(r.bw_share))
    return f, b


def summary(r: Roofline) -> str:
    """One line for the monitor: figures, shares where the GPU is known, reading."""
    parts: list[str] = []
    if r.flops_s is not None or r.bytes_s is not None:
        parts += rates(r)
    if r.tokens_per_step is not None:
        parts.append(f"{r.tokens_per_step:.1f} tok/step")
    parts.append(r.reading)
    return " · ".join(parts)
