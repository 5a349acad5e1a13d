"""The CPU compute dtype: bf16 only where the CPU has native bf16 kernels (faked CPU flags), the
override, and what the evaluation backends load with."""
import pytest

from evaluation.generation import HFBackend, estimate_kv_cache_gib, resolve_dtype
from infra.hardware import DTYPE_ENV, choose_cpu_dtype, cpu_description, cpu_flags

AVX2_ONLY = frozenset({"sse4_2", "avx", "avx2", "fma"})
SAPPHIRE_RAPIDS = AVX2_ONLY | {"avx512f", "avx512_bf16", "amx_bf16", "amx_tile"}


@pytest.fixture(autouse=True)
def no_override(monkeypatch):
    monkeypatch.delenv(DTYPE_ENV, raising=False)


@pytest.mark.parametrize("flags, expected", [
    (AVX2_ONLY, "fp32"),
    (AVX2_ONLY | {"avx512f", "avx512bw", "avx512vl"}, "fp32"),  # AVX-512 without its bf16 extension
    (AVX2_ONLY | {"avx512f", "avx512_bf16"}, "bf16"),  # Cooper Lake, Zen 4
    (SAPPHIRE_RAPIDS, "bf16"),
    (AVX2_ONLY | {"amx_bf16"}, "bf16"),
    (frozenset(), "fp32"),  # no /proc/cpuinfo: the safe choice
])
def test_bf16_only_where_the_cpu_has_native_kernels(flags, expected):
    choice = choose_cpu_dtype(flags)
    assert choice.name == expected
    assert choice.torch_name == {"bf16": "bfloat16", "fp32": "float32"}[expected]
    assert ("native bf16 kernels" in choice.reason) == (expected == "bf16")


@pytest.mark.parametrize("value, expected", [("fp32", "fp32"), ("bf16", "bf16"), (" BF16 ", "bf16"), ("", None)])
def test_the_environment_variable_overrides_the_flags(monkeypatch, value, expected):
    monkeypatch.setenv(DTYPE_ENV, value)
    for flags in (AVX2_ONLY, SAPPHIRE_RAPIDS):
        choice = choose_cpu_dtype(flags)
        if expected is None:  # empty means auto
            assert choice.name == ("bf16" if flags is SAPPHIRE_RAPIDS else "fp32")
        else:
            assert choice.name == expected and DTYPE_ENV in choice.reason


def test_an_unknown_request_names_the_choices():
    with pytest.raises(ValueError, match=f"{DTYPE_ENV}='fp16': use one of auto, bf16, fp32"):
        choose_cpu_dtype(AVX2_ONLY, requested="fp16")


CPUINFO = """processor\t: 0
vendor_id\t: AuthenticAMD
model name\t: AMD EPYC 7B13
flags\t\t: fpu sse4_2 avx avx2 fma

processor\t: 1
model name\t: AMD EPYC 7B13
flags\t\t: fpu sse4_2 avx avx2 fma
"""


def test_cpu_flags_and_description_from_cpuinfo():
    assert cpu_flags(CPUINFO) == {"fpu", "sse4_2", "avx", "avx2", "fma"}
    text = cpu_description(CPUINFO)
    assert text.startswith("AMD EPYC 7B13, ") and text.endswith("AVX2 (no AVX-512), no native bf16")
    spr = CPUINFO.replace("model name\t: AMD EPYC 7B13", "model name\t: Intel Xeon 8480").replace(
        "fma\n", "fma avx512f avx512_bf16 amx_bf16\n")
    assert cpu_description(spr).endswith("AVX-512, native bf16 (amx_bf16, avx512_bf16)")


def test_backends_resolve_auto_to_the_cpu_dtype(monkeypatch, tiny_model):
    monkeypatch.setenv(DTYPE_ENV, "fp32")
    assert resolve_dtype("auto") == "float32"
    assert resolve_dtype("bfloat16") == "bfloat16"  # an explicit choice is kept
    fp32_cache = estimate_kv_cache_gib(tiny_model, 4096, 4096)
    monkeypatch.setenv(DTYPE_ENV, "bf16")
    assert resolve_dtype("auto") == "bfloat16"
    assert estimate_kv_cache_gib(tiny_model, 4096, 4096) * 2 in (fp32_cache, fp32_cache + 1)  # 4 bytes vs 2
    backend = HFBackend(tiny_model)
    assert backend.dtype == "bfloat16"
    assert str(next(backend.model.parameters()).dtype) == "torch.bfloat16"
    monkeypatch.setenv(DTYPE_ENV, "fp32")
    assert str(next(HFBackend(tiny_model).model.parameters()).dtype) == "torch.float32"
