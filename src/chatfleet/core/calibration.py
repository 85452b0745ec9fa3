"""Every calibration constant of the twin, in one place, with its source.

Measured data (docs/facts.md#l4-calibration-points: an NVIDIA L4 running SGLang v0.5 with
Qwen3-8B, concurrency 1, closed loop, cache reset, 512 input and 128 output tokens per request):

    BF16 weights + BF16 KV: 13.42 output tok/s, median TTFT 189.16 ms
    FP8 weights + FP8 KV:   24.53 output tok/s, median TTFT 140.72 ms

These four numbers are the only data the step-time model is fitted on. Everything is derived
from them by `fit_l4()` below, under two stated assumptions, because one TTFT and one token
rate per precision cannot separate every constant:

1. ASSUMED_DECODE_FIXED_S: the per-step fixed cost of a CUDA-graph decode step (graph launch,
   sampling, scheduler bookkeeping not hidden by the overlap scheduler). With it, the BF16 token
   rate fixes the effective bandwidth. FP8 adds no constant of its own to decode: its decode time
   follows from its bytes (weights and KV) at that bandwidth.
2. ASSUMED_BF16_GEMM_EFF: the share of the L4's dense BF16 TFLOPS that a 512-token prefill's
   GEMMs reach. With it, the BF16 TTFT fixes the prefill fixed cost (per prefill step: request
   handling, tokenizer hand-off, first-token sampling and detokenising). FP8's TTFT then fixes
   FP8's one constant of its own, its GEMM efficiency.
   How far the knee moves if this split is wrong is measured by
   `benchmarks/calibration_sensitivity.py` and recorded in docs/calibration.md.

Not calibrated at all (no L4 data above batch 1): ASSUMED_EAGER_S, the extra cost of a decode
step above SGLang's CUDA-graph batch limit (24 on a 24 GB card), when PyTorch launches the
~700 kernels of a 36-layer step one by one; most of that launch time hides behind the GPU's
70 ms of weight streaming, so only the exposed part is counted.

Other GPUs reuse the L4's efficiencies and fixed costs on their own datasheet figures and are
marked uncalibrated until a profile measured on them exists (`chatfleet twin calibrate`).

The vLLM model (core/engine/mixed_step.py) has no L4 data at all: no vLLM run on an L4 has been
recorded. On the L4 it reuses the SGLang fit where the physics is shared (achieved bandwidth,
GEMM and attention efficiencies: kernels of the same kinds on the same card) and, assumed
engine-independent, the decode step's and the prefill step's fixed costs. Its one constant of
its own, the cost per extra sequence in a step (ASSUMED_VLLM_PER_SEQ_S: input preparation and
sampling bookkeeping per request), is assumed. Every vLLM-model result on the L4 is marked
uncalibrated until `chatfleet twin calibrate --engine-model vllm` fits a profile to a measured
vLLM sweep (`fit_point` with a held bandwidth, then the per-sequence cost from a second point;
twin/calibrate.py).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from chatfleet.core.engine.step_time import StepConstants, attention_pairs
from chatfleet.core.errors import ChatfleetError
from chatfleet.core.memory import CALIBRATED_GPUS, tier_defaults
from chatfleet.core.specs import GPU, Model, Precision, builtin_model, get_gpu


@dataclass(frozen=True, slots=True)
class C1Point:
    """A concurrency-1 calibration point."""

    weights: str
    kv_cache: str
    input_tokens: int
    output_tokens: int
    output_tok_s: float
    median_ttft_s: float

    @property
    def itl_s(self) -> float:
        """Time per output token after the first: (e2e - TTFT) / (output - 1)."""
        e2e = self.output_tokens / self.output_tok_s
        return (e2e - self.median_ttft_s) / (self.output_tokens - 1)


L4_C1_POINTS = (
    C1Point("bf16", "bf16", 512, 128, 13.42, 0.18916),
    C1Point("fp8", "fp8", 512, 128, 24.53, 0.14072),
)
L4_CALIBRATION_MODEL = "qwen3-8b"

ASSUMED_DECODE_FIXED_S = 0.0015
ASSUMED_BF16_GEMM_EFF = 0.50
ASSUMED_EAGER_S = 0.004
# The host tier's copies (HiCache load-back and write-back) over PCIe reach this share of the
# link's rate, one direction (specs.GPU.pcie_gbs: 32 GB/s for the L4's Gen4 x16): 25.6 GB/s,
# what pinned host <-> device copies usually reach on a Gen4 x16 link (CUDA's bandwidthTest).
# Assumed: no HiCache copy on an L4 has been measured.
ASSUMED_HOST_IO_EFF = 0.8
# vLLM model only, uncalibrated (see above): 50 us per sequence beyond the first in a step
ASSUMED_VLLM_PER_SEQ_S = 0.00005


@dataclass(frozen=True, slots=True)
class Calibration:
    """The fitted constants for one GPU, per weight dtype where they differ."""

    gpu: str
    bandwidth_eff: float
    decode_fixed_s: float
    prefill_fixed_s: float
    gemm_eff: dict[str, float]
    attn_eff: float
    eager_s: float
    calibrated: bool
    source: str
    per_seq_s: float = 0.0  # vLLM model: cost per sequence beyond the first in a step
    frontend_s: float = 0.0  # vLLM model: API-server time per request, before the engine
    # vLLM model: host time of a step that overlaps the GPU's (eager mode's kernel launches)
    launch_s: float = 0.0
    # vLLM model: latency from the API server to the engine that requests do not queue for
    # (the IPC hop and the first token's way back), beside frontend_s's serial share
    frontend_delay_s: float = 0.0
    # how far the fitted step time was off the measured one (a share; None: not measured with
    # this calibration, see STEP_TIME_BAND)
    error_band: float | None = None
    # vLLM model: the attention kernels' share of datasheet bandwidth reading the KV cache,
    # where a fit told it from the weights' (None: bandwidth_eff's)
    kv_read_eff: float | None = None

    def scaled(self, k: float) -> Calibration:
        """The same engine with every step k times as long: the fixed, per-sequence, launch
        and eager costs times k, the efficiencies divided by k (a host tier's PCIe load-back
        and the front end are not steps, and stay)."""
        if not k > 0:
            raise ChatfleetError("a step-time scale must be positive")
        return replace(
            self, bandwidth_eff=self.bandwidth_eff / k, decode_fixed_s=self.decode_fixed_s * k,
            prefill_fixed_s=self.prefill_fixed_s * k,
            gemm_eff={w: e / k for w, e in self.gemm_eff.items()}, attn_eff=self.attn_eff / k,
            eager_s=self.eager_s * k, per_seq_s=self.per_seq_s * k, launch_s=self.launch_s * k,
            kv_read_eff=None if self.kv_read_eff is None else self.kv_read_eff / k)

    def constants(self, gpu: GPU, weights: str) -> StepConstants:
        tier = tier_defaults(gpu.visible_mib)
        return StepConstants(
            bandwidth_eff=self.bandwidth_eff,
            gemm_eff=self.gemm_eff.get(weights, self.gemm_eff["bf16"]),
            attn_eff=self.attn_eff,
            decode_fixed_s=self.decode_fixed_s,
            prefill_fixed_s=self.prefill_fixed_s,
            eager_s=self.eager_s,
            cuda_graph_max_bs=tier.cuda_graph_max_bs,
            chunked_prefill_size=tier.chunked_prefill_size,
            host_io_eff=ASSUMED_HOST_IO_EFF,
            kv_read_eff=self.kv_read_eff,
        )


def fit_l4(
    decode_fixed_s: float = ASSUMED_DECODE_FIXED_S,
    bf16_gemm_eff: float = ASSUMED_BF16_GEMM_EFF,
    eager_s: float = ASSUMED_EAGER_S,
    points: tuple[C1Point, ...] = L4_C1_POINTS,
) -> Calibration:
    """Fit the L4 constants to the concurrency-1 points under the stated assumptions."""
    gpu = get_gpu("l4")
    model = builtin_model(L4_CALIBRATION_MODEL)
    bf16 = next(p for p in points if p.weights == "bf16")
    fp8 = next(p for p in points if p.weights == "fp8")

    # 1. Decode: bandwidth from BF16's time per token. The context grows from input+1 to
    #    input+output-1 over the decode steps; its mean is read once per step.
    mean_ctx = bf16.input_tokens + bf16.output_tokens / 2
    bytes_bf16 = (model.streamed_weight_bytes("bf16")
                  + mean_ctx * model.kv_bytes_per_token(bf16.kv_cache))
    streaming_s = bf16.itl_s - decode_fixed_s
    if streaming_s <= 0:
        raise ChatfleetError("the assumed decode fixed cost exceeds the measured time per token")
    bandwidth_eff = bytes_bf16 / (streaming_s * gpu.bandwidth_gbs * 1e9)

    # 2. Prefill: fixed cost from BF16's TTFT at the assumed GEMM efficiency.
    def compute_parts(p: C1Point, gemm_eff: float) -> tuple[float, float, float]:
        n = p.input_tokens
        flops = model.forward_flops(n, 1)
        gemm = flops / (gpu.tflops(p.weights) * 1e12 * gemm_eff)
        weights = model.streamed_weight_bytes(p.weights) / (
            gpu.bandwidth_gbs * 1e9 * bandwidth_eff)
        attn = (attention_pairs(0, n) * 4.0 * model.num_layers * model.num_attention_heads
                * model.head_dim) / (gpu.bf16_tflops * 1e12 * bf16_gemm_eff)
        return gemm, weights, attn

    gemm, weights, attn = compute_parts(bf16, bf16_gemm_eff)
    prefill_fixed_s = bf16.median_ttft_s - max(gemm, weights) - attn
    if prefill_fixed_s <= 0:
        raise ChatfleetError("the assumed BF16 GEMM efficiency leaves no prefill fixed cost")

    # 3. FP8's own constant: its GEMM efficiency, from its TTFT.
    _, weights8, attn8 = compute_parts(fp8, 1.0)
    gemm8_s = fp8.median_ttft_s - prefill_fixed_s - attn8
    if gemm8_s <= weights8:
        raise ChatfleetError(
            "FP8's TTFT is below the fixed cost plus its weight streaming under this split: "
            "lower the assumed BF16 GEMM efficiency"
        )
    fp8_gemm_eff = model.forward_flops(fp8.input_tokens, 1) / (
        gemm8_s * gpu.tflops("fp8") * 1e12)
    return Calibration(
        gpu="l4",
        bandwidth_eff=bandwidth_eff,
        decode_fixed_s=decode_fixed_s,
        prefill_fixed_s=prefill_fixed_s,
        gemm_eff={"bf16": bf16_gemm_eff, "fp8": fp8_gemm_eff},
        attn_eff=bf16_gemm_eff,
        eager_s=eager_s,
        calibrated=True,
        source=("docs/facts.md#l4-calibration-points (L4, SGLang v0.5, Qwen3-8B, concurrency 1); "
                "fit_l4()"),
    )


L4_CALIBRATION = fit_l4()


def calibration_for(gpu: GPU) -> Calibration:
    """The calibration for a card: measured for the L4, borrowed (uncalibrated) elsewhere."""
    if gpu.name in CALIBRATED_GPUS:
        return L4_CALIBRATION
    return replace(L4_CALIBRATION, gpu=gpu.name, calibrated=False,
                   source="L4 efficiencies on this card's datasheet figures (uncalibrated)")


@dataclass(frozen=True, slots=True)
class CardPhysics:
    """What a card's kernels reach, measured on the card itself without an engine."""

    bandwidth_eff: float  # achieved weight-streaming bandwidth / datasheet
    gemm_eff: float  # achieved dense GEMM rate of the weights' dtype / datasheet
    source: str


# benchmarks/device/phase_power.py on an H200 (2026-12-01, docs/device/h200-phase-power.json):
# Qwen3-8B's 252 BF16 weight GEMMs of one step as a CUDA graph in plain PyTorch. A 16-token
# decode step streamed the weights at 3,235.9 GB/s; a 4,096-token prefill step ran at 675.3
# TFLOPS (at the 700 W limit, the SM clock at 1,500 MHz). Datasheet: 4,800 GB/s, 989 TFLOPS.
H200_PHASE_POWER = CardPhysics(
    bandwidth_eff=3235.9 / 4800.0, gemm_eff=675.3 / 989.0,
    source="docs/device/h200-phase-power.json (benchmarks/device/phase_power.py, H200, BF16 "
           "weight GEMMs of Qwen3-8B as a CUDA graph, 2026-12-01)")


def card_physics(gpu: str, weights: str) -> CardPhysics | None:
    """The measured physics of a card for a weight dtype: the H200 (BF16, phase_power.py) and
    the L4 (the SGLang fit's bandwidth and GEMM efficiency, fit_l4); None elsewhere."""
    if gpu == "h200" and weights == "bf16":
        return H200_PHASE_POWER
    if gpu in CALIBRATED_GPUS:
        cal = L4_CALIBRATION
        return CardPhysics(cal.bandwidth_eff, cal.gemm_eff.get(weights, cal.gemm_eff["bf16"]),
                           "the L4 fit (fit_l4: SGLang v0.5 at concurrency 1)")
    return None


def vllm_calibration_for(gpu: GPU) -> Calibration:
    """The vLLM model's constants for a card: the SGLang fit's shared physics and fixed costs
    plus the assumed per-sequence cost; uncalibrated on every card (see the module docstring)."""
    base = calibration_for(gpu)
    return replace(base, per_seq_s=ASSUMED_VLLM_PER_SEQ_S, calibrated=False,
                   source=f"vLLM model: {base.source}, per-sequence cost assumed "
                          f"({ASSUMED_VLLM_PER_SEQ_S * 1e6:.0f} us); uncalibrated for vLLM")


# How far the twin's step time may be off where nothing measured it with the calibration in use
# (the built-in constants, or a profile without a band of its own). Measured on the only real
# engine chatfleet has run: vLLM 0.26 on an H200 (eager, Triton attention; docs/device/vllm/):
# fitted on every step of the l4pool sweep of 2026-12-03 (`twin calibrate`), the mean step of
# each of its points was within 13.6% of the fit, and of each point of the full sweep it was
# not fitted on (another workload: the shared prompt, mixed lengths, open loop) within 8.3%.
# The larger, rounded up. Borrowed for every card and engine model: no L4 run above one user
# exists. A sweep of another day (2026-12-01 runs, three engines sharing twelve cores) was off
# by up to 61%: the host's state, not the model (docs/twin.md#calibrating-the-vllm-model).
STEP_TIME_BAND = 0.14
STEP_TIME_BAND_SOURCE = (
    "the largest per-point error of the mean step when the vLLM model was fitted on every step "
    "of a real vLLM 0.26 on an H200 (13.6% on its points, 8.3% on a workload it was not fitted "
    "on; docs/device/vllm), borrowed: no L4 run above one user was measured")


def step_constants(gpu: GPU, model: Model, prec: Precision,
                   calibration: Calibration | None = None) -> StepConstants:
    cal = calibration or calibration_for(gpu)
    return cal.constants(gpu, prec.weights)


# --------------------------------------------------------------------------------------------
# Thermal profiles (first-order model in engine/thermal.py)
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ThermalProfile:
    """Cooling, power and clock behaviour of one card (the model is in engine/thermal.py).

    Heat: dT/dt = (T_inlet + R * P - T) / tau, one thermal resistance R from the die to the
    inlet air and one time constant tau (the heatsink's mass).

    Power, by what the step does: P = idle + u * (P_phase - idle) * f / loaded_mhz, u the
    share of the interval the card is busy, f the SM clock. At the loaded clock a prefill step
    (compute-bound) draws the cap, a decode step (memory-bound) idle + decode_power_ratio *
    (cap - idle).

    Clock: under load the card runs at `loaded_mhz` (the clock its power cap allows). Once the
    temperature reaches `slowdown_c` the driver lowers one clock for all work, to the clock at
    which the recent work (its power at the loaded clock, averaged over `mix_tau_s`) draws
    what the cooling sheds at the slowdown temperature, (slowdown_c - T_inlet) / R, never
    below `min_mhz`; it holds the temperature there and lets the clock back up when the
    recent work draws less than that at the loaded clock.

    What the clock does to the work: prefill (compute-bound) takes loaded_mhz / f longer;
    decode (memory-bound) keeps its speed while f stays above `mem_bound_floor_mhz` and slows
    as floor / f below it.
    """

    gpu: str
    ambient_c: float  # inlet air temperature
    idle_w: float
    cap_w: float
    loaded_mhz: float
    min_mhz: float
    slowdown_c: float
    mix_tau_s: float
    r_c_per_w: float
    tau_s: float
    mem_bound_floor_mhz: float
    decode_power_ratio: float
    source: str

    def phase_power_w(self, kind: str, prefill_share: float | None = None) -> float:
        """What a step of this kind draws at the loaded clock, busy throughout. A `mixed` step
        (vLLM: decodes and prefill chunks under one token budget) draws between the two, by
        `prefill_share`, the share of its tokens that are prefill tokens (assumed: a mixed
        step's GEMMs are as compute-bound as their tokens are prefill)."""
        decode = self.idle_w + self.decode_power_ratio * (self.cap_w - self.idle_w)
        if kind == "prefill":
            return self.cap_w
        if kind == "mixed":
            if prefill_share is None or not 0.0 <= prefill_share <= 1.0:
                raise ValueError("a mixed step needs its prefill share in [0, 1]")
            return prefill_share * self.cap_w + (1.0 - prefill_share) * decode
        return decode

    def power_w(self, utilization: float, kind: str, sm_mhz: float,
                prefill_share: float | None = None) -> float:
        return self.idle_w + utilization * (
            self.phase_power_w(kind, prefill_share) - self.idle_w) * (sm_mhz / self.loaded_mhz)

    def excess_w(self, utilization: float, kind: str,
                 prefill_share: float | None = None) -> float:
        """What the work draws above idle at the loaded clock."""
        return utilization * (self.phase_power_w(kind, prefill_share) - self.idle_w)

    def hold_w(self) -> float:
        """The power the cooling sheds at the slowdown temperature."""
        return (self.slowdown_c - self.ambient_c) / self.r_c_per_w

    def hold_clock(self, recent_excess_w: float) -> float:
        """The clock at which work drawing `recent_excess_w` above idle at the loaded clock
        draws the hold power (the loaded clock when it draws less)."""
        if recent_excess_w <= 0:
            return self.loaded_mhz
        f = self.loaded_mhz * (self.hold_w() - self.idle_w) / recent_excess_w
        return min(self.loaded_mhz, max(self.min_mhz, f))

    def busy_power_w(self, prefill_share: float, sm_mhz: float) -> float:
        """Mean power of a card busy all the time, `prefill_share` of it in prefill."""
        return (prefill_share * self.power_w(1.0, "prefill", sm_mhz)
                + (1.0 - prefill_share) * self.power_w(1.0, "decode", sm_mhz))


# The L4 overload measurement (docs/facts.md#l4-under-overload): under a sustained open-loop
# overload a measured L4 fell from 1,320 to 465 MHz with 70% of samples in thermal slowdown.
L4_OVERLOAD_LOADED_MHZ = 1320.0
L4_OVERLOAD_SETTLED_MHZ = 465.0
L4_OVERLOAD_SLOWDOWN_SHARE = 0.70

# What a decode step draws above idle, as a share of what a prefill step draws above idle (the
# cap). MEASURED on an H200 (NVML; benchmarks/device/phase_power.py, Qwen3-8B's weight GEMMs
# as CUDA graphs; docs/device/h200-phase-power.json): idle 77.8 W; decode of 16 tokens 493.9 W
# (weights streamed at 3.24 TB/s, tensor cores at 5% of peak); prefill of 4,096 tokens 691.8 W
# (at the 700 W cap, 675 TFLOPS): r = (493.9 - 77.8) / (691.8 - 77.8) = 0.678. CARRIED to the
# L4 at the same relative arithmetic intensity: the L4's decode at its knee (FP8, 24 running:
# 48 flop/byte against its 807 ridge, 6%; BF16 at 7 running: 2%) sits where the H200's decode
# of 16 tokens does (16 against 206, 8%), and memory traffic is about the same share of the
# decode's power on both (HBM3e at ~4 pJ/bit moving 3.2 TB/s is ~100 W of the H200's 416 W;
# GDDR6 at ~7.5 pJ/bit moving ~225 GB/s is ~13.5 W of the L4's 56 W). Not measured on an L4:
# larger batches push r up fast (the H200's decode of 64 tokens gave 0.967), so a deployment
# that decodes far more per step than the knee draws more than this.
DECODE_POWER_RATIO = 0.678


@dataclass(frozen=True, slots=True)
class OverloadRun:
    """The twin run that stands for the L4 overload measurement, and what the engine model
    does in it. The fit reproduces the measurement in exactly this run: `chatfleet twin
    sweep --concurrency '' --rate 4 --thermal` (BF16, the twin sweep's default workload:
    2,048-token shared prompt, 512 in / 128 out fixed, 30 s warm-up, 300 s window), the card
    cool (idle) at t = 0 and busy from the first arrival on.

    `prefill_share_loaded` and `prefill_share_settled` are the shares of busy time spent in
    prefill with the clock held at the loaded and at the settled clock, measured by the twin
    (`tests/core/test_thermal.py::test_overload_prefill_shares_are_the_twins` measures them
    again, so a change to the engine model that moves them fails there). They do not depend
    on the power model: only on what the clock does to step times.
    """

    weights: str = "bf16"
    rate_rps: float = 4.0
    warmup_s: float = 30.0
    duration_s: float = 300.0
    prefill_share_loaded: float = 0.231
    prefill_share_settled: float = 0.282


L4_OVERLOAD_RUN = OverloadRun()


def fit_l4_thermal(decode_power_ratio: float = DECODE_POWER_RATIO,
                   run: OverloadRun = L4_OVERLOAD_RUN) -> ThermalProfile:
    """The L4's thermal resistance and time constant, fitted so that the overload run gives
    the L4 overload measurement under the phase power model, for any decode power ratio.

    Assumed: 35 C inlet, 16 W idle, 72 W cap, the loaded clock 1,320 MHz (where the measured
    card started), slowdown at 87 C, the driver's clock following the work of the last 30 s,
    floor 210 MHz, decode memory-bound down to 900 MHz. Fitted:
    - R: settled at 465 MHz, the card draws busy_power(prefill_share_settled, 465 MHz), which
      holds it at the slowdown temperature: R = (slowdown - inlet) / that power.
    - tau: from a cool start (inlet + R * idle) the card heats at the loaded clock towards
      inlet + R * busy_power(prefill_share_loaded, 1,320 MHz) and must reach the slowdown
      temperature when 30% of the window has passed (70% of the samples in slowdown).
    """
    if not 0.0 < decode_power_ratio <= 1.0:
        raise ValueError("the decode power ratio must be in (0, 1]")
    base = ThermalProfile(
        "l4", ambient_c=35.0, idle_w=16.0, cap_w=72.0, loaded_mhz=L4_OVERLOAD_LOADED_MHZ,
        min_mhz=210.0, slowdown_c=87.0, mix_tau_s=30.0, r_c_per_w=1.0, tau_s=1.0,
        mem_bound_floor_mhz=900.0, decode_power_ratio=decode_power_ratio,
        source=(f"fitted to the L4 overload measurement (fit_l4_thermal, decode power ratio "
                f"{decode_power_ratio:g})"))
    settled = L4_OVERLOAD_SETTLED_MHZ
    r = ((base.slowdown_c - base.ambient_c)
         / base.busy_power_w(run.prefill_share_settled, settled))
    start = base.ambient_c + r * base.idle_w
    final = base.ambient_c + r * base.busy_power_w(run.prefill_share_loaded, base.loaded_mhz)
    if final <= base.slowdown_c:
        raise ValueError("under this power model the overload never reaches slowdown")
    t_hit = run.warmup_s + (1.0 - L4_OVERLOAD_SLOWDOWN_SHARE) * run.duration_s
    tau = t_hit / math.log((final - start) / (final - base.slowdown_c))
    return replace(base, r_c_per_w=r, tau_s=tau)


THERMAL_PROFILES: dict[str, ThermalProfile] = {"l4": fit_l4_thermal()}


def thermal_profile(gpu: GPU) -> ThermalProfile:
    """The L4's fitted profile; actively cooled or larger cards get one that never throttles
    at their rated power in a 35 C inlet (uncalibrated)."""
    if gpu.name in THERMAL_PROFILES:
        return THERMAL_PROFILES[gpu.name]
    loaded = gpu.boost_mhz * 0.9
    r = (80.0 - 35.0) / gpu.power_w  # reaches 80 C at full power: below slowdown
    return ThermalProfile(gpu.name, 35.0, gpu.power_w * 0.15, gpu.power_w, loaded, 210.0, 87.0,
                          30.0, r, 120.0, loaded * 0.5, DECODE_POWER_RATIO,
                          source="generic, uncalibrated")


# --------------------------------------------------------------------------------------------
# Profiles fitted to a live sweep (`chatfleet twin calibrate`)
# --------------------------------------------------------------------------------------------


def fit_point(
    gpu: GPU,
    model: Model,
    weights: str,
    kv_cache: str,
    *,
    tpot_s: float,
    ttft_s: float,
    new_tokens: float,
    cached_tokens: float,
    decode_context: float,
    decode_fixed_s: float = ASSUMED_DECODE_FIXED_S,
    gemm_eff: float = ASSUMED_BF16_GEMM_EFF,
    eager_s: float = ASSUMED_EAGER_S,
    source: str = "",
    bandwidth_eff: float | None = None,
    per_seq_s: float = 0.0,
) -> Calibration:
    """Fit bandwidth efficiency and the prefill fixed cost to one concurrency-1 measurement of
    any engine on any card, the way `fit_l4` does (same assumed decode fixed cost and GEMM
    efficiency): decode from the time per output token at the mean context, prefill from the
    TTFT of `new_tokens` computed after `cached_tokens` found in the cache.

    With `bandwidth_eff` given, the bandwidth is held there and the time per token fixes the
    decode step's fixed cost instead (the split the vLLM model's calibration uses: an engine
    build changes its per-step overhead, eager or CUDA graphs, far more than the bandwidth its
    kernels reach on a card)."""
    if new_tokens < 1 or ttft_s <= 0:
        raise ChatfleetError("the calibration point needs a positive TTFT and prompt")
    kvb = model.kv_bytes_per_token(kv_cache)
    bytes_step = model.streamed_weight_bytes(weights) + decode_context * kvb
    if bandwidth_eff is None:
        if tpot_s <= decode_fixed_s:
            raise ChatfleetError(f"time per token {tpot_s * 1000:.2f} ms is below the assumed "
                                 f"decode fixed cost ({decode_fixed_s * 1000:.2f} ms)")
        bandwidth_eff = bytes_step / ((tpot_s - decode_fixed_s) * gpu.bandwidth_gbs * 1e9)
    else:
        if not 0 < bandwidth_eff <= 1.5:
            raise ChatfleetError("the held bandwidth efficiency must be in (0, 1.5]")
        decode_fixed_s = tpot_s - bytes_step / (gpu.bandwidth_gbs * 1e9 * bandwidth_eff)
        if decode_fixed_s <= 0:
            raise ChatfleetError(
                f"time per token {tpot_s * 1000:.2f} ms is faster than streaming the weights "
                f"and KV at bandwidth efficiency {bandwidth_eff}: pass a higher one")
    bw = gpu.bandwidth_gbs * 1e9 * bandwidth_eff
    gemm = model.forward_flops(int(new_tokens), 1) / (gpu.tflops(weights) * 1e12 * gemm_eff)
    weights_s = model.streamed_weight_bytes(weights) / bw
    attn = (attention_pairs(cached_tokens, new_tokens) * 4.0 * model.num_layers
            * model.num_attention_heads * model.head_dim) / (gpu.bf16_tflops * 1e12 * gemm_eff)
    kv_read = cached_tokens * kvb / bw
    fixed = ttft_s - max(gemm, weights_s) - attn - kv_read
    if fixed <= 0:
        raise ChatfleetError(
            f"TTFT {ttft_s * 1000:.1f} ms is shorter than the modelled prefill alone at GEMM "
            f"efficiency {gemm_eff}: pass a higher --gemm-eff")
    return Calibration(gpu=gpu.name, bandwidth_eff=bandwidth_eff, decode_fixed_s=decode_fixed_s,
                       prefill_fixed_s=fixed, gemm_eff={"bf16": gemm_eff, "fp8": gemm_eff},
                       attn_eff=gemm_eff, eager_s=eager_s, calibrated=True, source=source,
                       per_seq_s=per_seq_s)


def calibration_to_json(cal: Calibration) -> dict[str, object]:
    return {"gpu": cal.gpu, "bandwidth_eff": cal.bandwidth_eff,
            "decode_fixed_s": cal.decode_fixed_s, "prefill_fixed_s": cal.prefill_fixed_s,
            "gemm_eff": dict(cal.gemm_eff), "attn_eff": cal.attn_eff, "eager_s": cal.eager_s,
            "calibrated": cal.calibrated, "source": cal.source, "per_seq_s": cal.per_seq_s,
            "frontend_s": cal.frontend_s, "launch_s": cal.launch_s,
            "frontend_delay_s": cal.frontend_delay_s, "error_band": cal.error_band,
            **({} if cal.kv_read_eff is None else {"kv_read_eff": cal.kv_read_eff})}


def calibration_from_json(d: dict[str, object]) -> Calibration:
    try:
        gemm = d["gemm_eff"]
        if not isinstance(gemm, dict):
            raise TypeError("gemm_eff must be an object")
        cal = Calibration(
            gpu=str(d["gpu"]), bandwidth_eff=float(d["bandwidth_eff"]),  # type: ignore[arg-type]
            decode_fixed_s=float(d["decode_fixed_s"]),  # type: ignore[arg-type]
            prefill_fixed_s=float(d["prefill_fixed_s"]),  # type: ignore[arg-type]
            gemm_eff={str(k): float(v) for k, v in gemm.items()},
            attn_eff=float(d["attn_eff"]),  # type: ignore[arg-type]
            eager_s=float(d["eager_s"]),  # type: ignore[arg-type]
            calibrated=bool(d.get("calibrated", True)), source=str(d.get("source", "")),
            per_seq_s=float(d.get("per_seq_s", 0.0)),  # type: ignore[arg-type]
            frontend_s=float(d.get("frontend_s", 0.0)),  # type: ignore[arg-type]
            launch_s=float(d.get("launch_s", 0.0)),  # type: ignore[arg-type]
            frontend_delay_s=float(d.get("frontend_delay_s", 0.0)),  # type: ignore[arg-type]
            error_band=None if d.get("error_band") is None
            else float(d["error_band"]),  # type: ignore[arg-type]
            kv_read_eff=None if d.get("kv_read_eff") is None
            else float(d["kv_read_eff"]))  # type: ignore[arg-type]
    except (KeyError, TypeError, ValueError) as exc:
        raise ChatfleetError(f"not a calibration profile: {exc}") from exc
    if (not 0 < cal.bandwidth_eff <= 1.5 or cal.prefill_fixed_s < 0 or cal.decode_fixed_s < 0
            or cal.per_seq_s < 0 or cal.frontend_s < 0 or cal.launch_s < 0
            or cal.frontend_delay_s < 0
            or (cal.kv_read_eff is not None and not 0 < cal.kv_read_eff <= 1.5)
            or (cal.error_band is not None and not 0 <= cal.error_band < 1)):
        raise ChatfleetError("calibration profile has out-of-range constants")
    return cal
