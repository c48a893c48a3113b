"""dtype selection: explicit names map directly; "auto" is bf16 on GPUs and, on CPUs, the
faster of the two in a cached matmul probe. The measured numbers are injected (`measure`)
where the choice is checked, so the tests do not depend on this machine's speed or load."""

import json

import pytest
import torch

from hybridflow.engines import precision
from hybridflow.engines.precision import MatmulRates, ProbeShape, auto_dtype, probe_matmul, resolve_dtype


@pytest.fixture(autouse=True)
def cache(tmp_path, monkeypatch):
    """A fresh cache folder and no figures remembered in this process."""
    monkeypatch.setenv("HYBRIDFLOW_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(precision, "_MEMO", {})
    return tmp_path / "cache"


def rates(fp32: float, bf16: float) -> MatmulRates:
    return MatmulRates(fp32, bf16, threads=2, load=0.0, measured_at="2026-11-27T00:00:00")


class Recorded:
    """A measurement that returns fixed figures and counts its calls."""

    def __init__(self, fp32: float, bf16: float) -> None:
        self.figures, self.calls = rates(fp32, bf16), []

    def __call__(self, shape: ProbeShape, threads: int) -> MatmulRates:
        self.calls.append((shape, threads))
        return self.figures


def test_explicit_names():
    assert resolve_dtype("bf16", "cpu") is torch.bfloat16
    assert resolve_dtype("fp32", "cuda") is torch.float32


def test_unknown_name_is_refused():
    with pytest.raises(ValueError, match="dtype must be one of"):
        resolve_dtype("fp16", "cpu")


def test_gpus_take_bf16_without_measuring():
    def never(shape, threads):
        raise AssertionError("a GPU is not probed")

    choice = auto_dtype("cuda", measure=never)
    assert choice.dtype == "bf16" and choice.rates is None


@pytest.mark.parametrize(("fp32", "bf16", "picked"), [(226.0, 157.0, "fp32"), (40.0, 85.0, "bf16"),
                                                      (50.0, 50.0, "fp32")])
def test_cpu_auto_picks_the_faster_measured_dtype(fp32, bf16, picked):
    choice = auto_dtype("cpu", ProbeShape(576, 1536), threads=2, measure=Recorded(fp32, bf16))
    assert choice.dtype == picked  # a tie keeps full precision
    assert f"fp32 {fp32:.0f} GFLOP/s, bf16 {bf16:.0f} GFLOP/s" in choice.reason and "hidden 576" in choice.reason


def test_figures_are_cached_per_machine_shape_and_threads(cache):
    measure = Recorded(100.0, 60.0)
    shape = ProbeShape(576, 1536)
    assert auto_dtype("cpu", shape, 2, measure).dtype == "fp32"
    assert auto_dtype("cpu", shape, 2, measure).dtype == "fp32"
    assert measure.calls == [(shape, 2)]  # measured once
    stored = json.loads(precision.probe_cache_file().read_text())
    assert precision.probe_cache_file().parent == cache / "precision"
    assert stored == {"h576-i1536-t2": {"fp32_gflops": 100.0, "bf16_gflops": 60.0, "threads": 2, "load": 0.0,
                                        "measured_at": "2026-11-27T00:00:00"}}
    # another process (nothing remembered) reads the file instead of timing again
    precision._MEMO.clear()

    def never(shape, threads):
        raise AssertionError("cached figures are read, not measured")

    assert auto_dtype("cpu", shape, 2, never).dtype == "fp32"
    # another shape or thread count is measured, and added to the same file
    auto_dtype("cpu", ProbeShape(2048, 8192), 2, measure)
    auto_dtype("cpu", shape, 1, measure)
    assert len(measure.calls) == 3
    assert set(json.loads(precision.probe_cache_file().read_text())) == {"h576-i1536-t2", "h2048-i8192-t2",
                                                                         "h576-i1536-t1"}


def test_figures_measured_under_load_are_measured_again_on_a_quiet_machine(cache, monkeypatch):
    monkeypatch.setattr(precision.os, "cpu_count", lambda: 2)  # quiet: a 1-minute load below 1.0 on 2 cores
    shape = ProbeShape(576, 1536)
    loaded = Recorded(100.0, 60.0)
    loaded.figures = MatmulRates(100.0, 60.0, threads=2, load=5.2, measured_at="2026-11-27T00:00:00")
    choice = auto_dtype("cpu", shape, 2, loaded, load_now=lambda: 5.2)
    assert choice.dtype == "fp32" and "load 5.2 on 2 cores: under load, measured again" in choice.reason
    precision._MEMO.clear()  # a later run, still under load: the stored figures stand, the load is said
    again = auto_dtype("cpu", shape, 2, Recorded(40.0, 85.0), load_now=lambda: 3.0)
    assert again.dtype == "fp32" and "under load" in again.reason
    precision._MEMO.clear()  # a run on a quiet machine measures again and stores the quiet figures
    quiet = Recorded(40.0, 85.0)
    assert auto_dtype("cpu", shape, 2, quiet, load_now=lambda: 0.3).dtype == "bf16" and len(quiet.calls) == 1
    assert json.loads(precision.probe_cache_file().read_text())["h576-i1536-t2"]["load"] == 0.0
    precision._MEMO.clear()  # quiet figures are kept, whatever the load later
    assert auto_dtype("cpu", shape, 2, Recorded(100.0, 1.0), load_now=lambda: 9.0).dtype == "bf16"


def test_a_damaged_cache_file_is_measured_again(cache):
    path = precision.probe_cache_file()
    path.parent.mkdir(parents=True)
    path.write_text("{not json")
    measure = Recorded(10.0, 20.0)
    assert auto_dtype("cpu", ProbeShape(64, 256), 1, measure).dtype == "bf16" and len(measure.calls) == 1


def test_probe_shapes_follow_the_model_and_stay_bounded():
    assert ProbeShape(576, 1536).matmuls() == [(256, 576, 576), (256, 576, 1536)]
    rows, hidden, inter = ProbeShape(1024, 4096).matmuls()[1]
    assert (hidden, inter) == (1024, 4096) and 2 * rows * hidden * inter <= precision.PROBE_FLOP < 2 * 256 * 1024 * 4096
    assert ProbeShape(8192, 28672).matmuls()[0][0] == 16  # never fewer rows than a small batch


def test_the_real_probe_measures_both_dtypes():
    """On this machine: positive rates for a small shape, and the choice follows them."""
    got = probe_matmul(ProbeShape(64, 256), threads=1, seconds=0.02)
    assert got.fp32_gflops > 0 and got.bf16_gflops > 0 and got.threads == 1
    assert got.faster == ("bf16" if got.bf16_gflops > got.fp32_gflops else "fp32")
    assert torch.get_num_threads() >= 1  # the probe restored the thread count it changed
