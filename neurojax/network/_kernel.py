"""Transitional names of the compiled CPU kernels' FFI targets, for the call sites that have
not moved onto the kernel registry (`neurojax.kernels`) yet; see that package."""

from ..kernels import _build, _config

TARGET = "nj_csr_deliver"
STDP_TARGET = "nj_stdp_update"
ASM_ROWSUM_TARGET = "nj_asm_rowsum"
ASM_UPDATE_TARGET = "nj_asm_update"
ASM_UPDATE_SUM_TARGET = "nj_asm_update_sum"
ASM_CHOOSE_TARGET = "nj_asm_choose"
ASM_TOPK_TARGET = "nj_asm_topk"
ASM_BITS_TARGET = "nj_asm_bits"
ASM_CAP_TARGET = "nj_asm_cap"
LIF_RUN_TARGET = "nj_lif_run"
HH_RUN_TARGET = "nj_hh_run"
SPIKE_MATMUL_TARGET = "nj_spike_matmul"
SPIKE_MATMUL_T_TARGET = "nj_spike_matmul_t"
_HANDLERS = (
    (TARGET, "NjCsrDeliver"),
    (STDP_TARGET, "NjStdpUpdate"),
    (ASM_ROWSUM_TARGET, "NjAsmRowSum"),
    (ASM_UPDATE_TARGET, "NjAsmUpdate"),
    (ASM_UPDATE_SUM_TARGET, "NjAsmUpdateSum"),
    (ASM_CHOOSE_TARGET, "NjAsmChoose"),
    (ASM_TOPK_TARGET, "NjAsmTopK"),
    (ASM_BITS_TARGET, "NjAsmBits"),
    (ASM_CAP_TARGET, "NjAsmCap"),
    (LIF_RUN_TARGET, "NjLifRun"),
    (HH_RUN_TARGET, "NjHhRun"),
    (SPIKE_MATMUL_TARGET, "NjSpikeMatmul"),
    (SPIKE_MATMUL_T_TARGET, "NjSpikeMatmulT"),
)


def enabled() -> bool:
    return _config.mode() == "auto"


def available() -> bool:
    return enabled() and _build.register_targets(_HANDLERS)
