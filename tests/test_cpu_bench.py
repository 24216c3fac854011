"""The benchmark package without a GPU: the attention benchmark's shapes, FLOP and byte counts,
float64 reference, command line, report tables and files, and its no-GPU run.

The GPU measurements themselves run on a GPU machine (``python -m cunorm.bench attention``);
everything here is the pure part around them, so CI covers it.
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from cunorm.bench import attention as A
from cunorm.bench import attention_report as R
from cunorm.bench import env
from cunorm.bench.__main__ import build_parser, main
from cunorm.bench.attention_peers import torch_has_enable_gqa
from cunorm.bench.attention_run import AttnCell, AttnResult, AttnRun
from cunorm.bench.ops import OPS, OpSpec, rowwise_ops


# -- formulas and shapes ----------------------------------------------------------------------
def test_flops_follow_the_flashattention_convention() -> None:
    # 4·B·H·Lq·Lk·D, halved for causal.
    assert A.attention_flops(2, 16, 4096, 4096, 128, causal=False) == 4 * 2 * 16 * 4096**2 * 128
    assert A.attention_flops(2, 16, 4096, 4096, 128, causal=True) == 2 * 2 * 16 * 4096**2 * 128
    assert A.tflops(10**12, 1000.0) == pytest.approx(1.0)
    assert A.tflops(A.attention_flops(1, 32, 16384, 16384, 64, False), 7.0) == pytest.approx(
        4 * 32 * 16384**2 * 64 / 7e-3 / 1e12
    )


def test_kv_bytes_count_k_and_v_once() -> None:
    assert A.kv_read_bytes(1, 8, 131072, 128, 2) == 2 * 8 * 131072 * 128 * 2
    s = A.AttnShape(8, 32, 8, 1, 4096, 128, False, "float16")
    assert s.kv_bytes == A.kv_read_bytes(8, 8, 4096, 128, 2)
    assert s.gqa and s.q_shape == (8, 32, 1, 128) and s.kv_shape == (8, 8, 4096, 128)
    assert s.io_bytes == (2 * 8 * 32 * 1 * 128 + 2 * 8 * 8 * 4096 * 128) * 2


def test_main_sweep_is_16k_tokens_hidden_2048() -> None:
    shapes = A.main_shapes(A.SEQLENS, A.HEAD_DIMS, A.DEFAULT_DTYPES)
    assert len(shapes) == len(A.SEQLENS) * len(A.HEAD_DIMS) * 2 * len(A.DEFAULT_DTYPES) == 48
    for s in shapes:
        assert s.batch * s.lq == 16384 and s.hq * s.d == 2048
        assert s.hq == s.hkv and s.lq == s.lk and s.dtype in ("bfloat16", "float16")
    assert A.SEQLENS == (512, 1024, 2048, 4096, 8192, 16384) and A.HEAD_DIMS == (64, 128)
    # Ordered dtype, D, L, non-causal before causal (as the anchor tables).
    keys = [(A.DEFAULT_DTYPES.index(s.dtype), s.d, s.lq, s.causal) for s in shapes]
    assert keys == sorted(keys)
    assert {(s.batch, s.hq) for s in shapes if s.lq == 512 and s.d == 64} == {(32, 32)}
    # Longer than the token budget: one sequence.
    assert A.main_shapes([32768], [128], ["bfloat16"])[0].batch == 1
    with pytest.raises(ValueError, match="does not divide"):
        A.main_shapes([512], [96], ["bfloat16"])


def test_decode_and_memory_shapes() -> None:
    dec = A.decode_shapes(A.DECODE_LKS, [1, 8], ["bfloat16"])
    assert [s.lk for s in dec[:6]] == [4096, 8192, 16384, 32768, 65536, 131072]
    assert all(s.lq == 1 and (s.hq, s.hkv, s.d) == (32, 8, 128) and not s.causal for s in dec)
    assert {s.batch for s in dec} == {1, 8}
    mem = A.memory_shapes()
    assert [s.causal for s in mem] == [False, True]
    assert all((s.batch, s.hq, s.lq, s.d, s.dtype) == (1, 16, 65536, 128, "bfloat16") for s in mem)
    assert mem[0].io_bytes == 4 * 65536 * 16 * 128 * 2


def test_labels() -> None:
    assert A.AttnShape(8, 32, 32, 2048, 2048, 64, True, "bfloat16").label == (
        "bf16 B=8 H=32 L=2048 D=64 causal"
    )
    assert A.AttnShape(1, 32, 8, 1, 4096, 128, False, "float16").label == (
        "fp16 B=1 Hq=32 Hkv=8 Lq=1 Lk=4096 D=128"
    )


# -- the float64 reference --------------------------------------------------------------------
def _naive(q: np.ndarray, k: np.ndarray, v: np.ndarray, causal: bool) -> np.ndarray:
    """Row by row, in float64, the way the formula reads (bottom-right causal alignment)."""
    lq, lk = q.shape[-2], k.shape[-2]
    out = np.zeros(q.shape[:-1] + (v.shape[-1],))
    for idx in np.ndindex(q.shape[:-2]):
        for i in range(lq):
            s = k[idx].astype(np.float64) @ q[idx][i].astype(np.float64) / math.sqrt(q.shape[-1])
            n = i + lk - lq + 1 if causal else lk
            if n <= 0:
                continue
            p = np.exp(s[:n] - s[:n].max())
            out[idx][i] = p @ v[idx][:n].astype(np.float64) / p.sum()
    return out


@pytest.mark.parametrize("lq,lk", [(7, 7), (3, 9), (9, 3), (1, 16)])
@pytest.mark.parametrize("causal", [False, True])
def test_reference_matches_naive(rng: np.random.Generator, lq: int, lk: int, causal: bool) -> None:
    q = rng.standard_normal((2, 3, lq, 8))
    k = rng.standard_normal((2, 3, lk, 8))
    v = rng.standard_normal((2, 3, lk, 5))
    last = A.causal_last_key(lq, lk, np.arange(lq)) if causal else None
    got = A.reference_attention(np, q, k, v, last_key=last)
    np.testing.assert_allclose(got, _naive(q, k, v, causal), rtol=1e-12, atol=1e-14)
    # Fully masked rows (Lq > Lk, causal, bottom-right aligned) give 0 and no NaN.
    assert np.isfinite(got).all()
    if causal and lq > lk:
        assert not got[..., : lq - lk, :].any()


def test_reference_scale_and_row_errors(rng: np.random.Generator) -> None:
    q, k, v = (rng.standard_normal((4, 16)) for _ in range(3))
    a = A.reference_attention(np, q, k, v, scale=0.5)
    b = A.reference_attention(np, q * 2, k, v)  # default scale 1/sqrt(16) = 0.5 / 2
    np.testing.assert_allclose(a, b, rtol=1e-12)
    ref = np.array([[1.0, -2.0], [0.5, 0.25]])
    out = np.array([[1.0, -1.9], [np.nan, 0.25]])
    err = A.row_errors(np, out, ref)
    assert err[0] == pytest.approx(0.05) and err[1] == np.inf


# -- command line ------------------------------------------------------------------------------
def _args(*argv: str) -> argparse.Namespace:
    p = build_parser()
    args = p.parse_args(["attention", *argv])
    A.normalize_args(p, args)
    return args


def test_cli_defaults_and_quick() -> None:
    a = _args()
    assert a.dtypes == ["bfloat16", "float16"] and a.seqlens == list(A.SEQLENS)
    assert a.head_dims == [64, 128] and a.decode_lks == list(A.DECODE_LKS)
    assert a.decode_batch == [1] and a.peers == list(A.ATTN_PEER_NAMES)
    fwd, dec = A.sweep_shapes(a)
    assert len(fwd) == 48 and len(dec) == 12
    q = _args("--quick")
    assert q.dtypes == ["bfloat16"] and q.seqlens == list(A.QUICK_SEQLENS)
    fwd, dec = A.sweep_shapes(q)
    assert len(fwd) == 12 and len(dec) == 3


def test_cli_options() -> None:
    a = _args("--dtypes", "fp16", "--seqlens", "1024,4096", "--head-dims", "128", "--peers",
              "fa2,cudnn", "jax-xla", "--decode-batch", "1", "8", "--float32")  # fmt: skip
    assert a.dtypes == ["float16"] and a.peers == ["flash", "cudnn", "jax"]
    fwd, dec = A.sweep_shapes(a)
    assert {s.dtype for s in fwd} == {"float16", "float32"}
    assert {s.lq for s in fwd if s.dtype == "float32"} == {1024}
    assert {s.batch for s in dec} == {1, 8} and {s.dtype for s in dec} == {"float16"}
    b = _args("--no-main", "--no-decode", "--no-peers")
    assert A.sweep_shapes(b) == ([], []) and b.peers == []


@pytest.mark.parametrize(
    "argv,message",
    [
        (["--cols", "1024"], "do not apply to attention"),
        (["--peers", "flash,bogus"], "unknown attention peer"),
        (["--head-dims", "96"], "must divide 2048"),
        (["--seqlens", "0"], "must be positive"),
    ],
)
def test_cli_errors_exit_2(argv: list[str], message: str, capsys: Any) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["attention", *argv])
    assert exc.value.code == 2
    assert message in capsys.readouterr().err


def test_help_mentions_attention(capsys: Any) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["--help"])
    assert exc.value.code == 0
    out = capsys.readouterr().out
    assert "attention" in out and "--seqlens" in out and "--decode-lks" in out


def test_attention_op_entry() -> None:
    op = OPS["attention"]
    assert not op.rowwise and op.runner is not None and op not in rowwise_ops()
    assert op.usage == "`cunorm.attention(q, k, v, causal=causal)`"


def test_attention_resolve_needs_causal(monkeypatch: pytest.MonkeyPatch) -> None:
    import cunorm

    monkeypatch.setattr(cunorm, "attention", lambda q, k, v: q, raising=False)
    fn, why = OPS["attention"].resolve()
    assert fn is None and "causal" in why
    monkeypatch.delattr(cunorm, "attention", raising=False)
    fn, why = OPS["attention"].resolve()
    assert fn is None and "not available yet" in why


def test_sdpa_refusal_reasons() -> None:
    from cunorm.bench.attention_peers import _reason

    tail = " (Triggered internally at /pytorch/aten/src/ATen/native/transformers/sdp_utils.cpp:1.)"
    assert _reason("Memory efficient kernel not used because:" + tail) == ""
    assert _reason("Flash attention has been runtime disabled." + tail) == ""
    msg = "For dense input, both fused kernels require the same num_heads. Query.sizes(): [1, 32]"
    assert _reason(msg + tail + "\nmore") == msg


def test_refusals_noted_once_per_peer_part_dtype() -> None:
    from cunorm.bench.attention_run import AttentionBench
    from cunorm.bench.sweep import Notes

    bench = AttentionBench.__new__(AttentionBench)  # no GPU buffers: only the notes are used
    bench.notes, bench._refused = Notes(), set()
    bench.notes.sink = lambda m: None
    for lk in (4096, 8192):
        for dtype in ("bfloat16", "float16"):
            s = A.AttnShape(1, 32, 8, 1, lk, 128, False, dtype)
            bench._note_refusal("efficient", "decoding", s, f"sizes [1, 8, {lk}, 128]")
    assert len(bench.notes.lines) == 2
    assert bench.notes.lines[0].startswith(
        "efficient: n/a in decoding cells (bfloat16, grouped-query), e.g. bf16 B=1 Hq=32"
    )
    assert bench.notes.lines[0].endswith("sizes [1, 8, 4096, 128]")


def test_torch_enable_gqa_version() -> None:
    assert torch_has_enable_gqa("2.11.0+cu130") and torch_has_enable_gqa("2.5.0")
    assert not torch_has_enable_gqa("2.4.1") and not torch_has_enable_gqa("1.13.1")


# -- no GPU --------------------------------------------------------------------------------------
def _fake_attention(q: Any, k: Any, v: Any, *, causal: bool = False, **_: Any) -> Any:
    last = A.causal_last_key(q.shape[-2], k.shape[-2], np.arange(q.shape[-2])) if causal else None
    return A.reference_attention(np, q, k, v, last_key=last).astype(q.dtype)


def test_no_gpu_runs_the_numpy_path(monkeypatch: pytest.MonkeyPatch, capsys: Any) -> None:
    import cunorm

    monkeypatch.setattr(env, "probe_gpu", lambda: (False, "test: no GPU"))
    monkeypatch.setattr(A, "NUMPY_SEQLENS", (32, 64))
    monkeypatch.setattr(cunorm, "attention", _fake_attention, raising=False)
    assert main(["attention"]) == 0
    out = capsys.readouterr().out
    assert env.NO_GPU_MESSAGE in out
    rows = [line.split() for line in out.splitlines() if line.strip().startswith(("32", "64"))]
    assert len(rows) == 4 and all(r[-1] == "ok" for r in rows)


def test_no_gpu_reports_mismatch(monkeypatch: pytest.MonkeyPatch, capsys: Any) -> None:
    import cunorm

    monkeypatch.setattr(env, "probe_gpu", lambda: (False, "test: no GPU"))
    monkeypatch.setattr(A, "NUMPY_SEQLENS", (32,))
    monkeypatch.setattr(cunorm, "attention", lambda q, k, v, *, causal=False: v[..., :1, :] * 0 + q,
                        raising=False)  # fmt: skip
    assert main(["attention"]) == 0
    assert "MISMATCH" in capsys.readouterr().out


def test_no_gpu_without_attention_exits_2(monkeypatch: pytest.MonkeyPatch, capsys: Any) -> None:
    import cunorm

    monkeypatch.setattr(env, "probe_gpu", lambda: (False, "test: no GPU"))
    monkeypatch.delattr(cunorm, "attention", raising=False)
    assert main(["attention"]) == 2
    out = capsys.readouterr().out
    assert env.NO_GPU_MESSAGE in out and "not available yet" in out


# -- report ----------------------------------------------------------------------------------------
def _res(value: float | None, kind: str, status: str = "ok") -> AttnResult:
    if status == "n/a":
        return AttnResult(status="n/a", note="refused")
    r = AttnResult(ms=1.0, status=status)
    if kind == "forward":
        r.tflops = value
    else:
        r.gbps = value
    return r


def _cell(shape: A.AttnShape, kind: str, cunorm: float | None, **peers: Any) -> AttnCell:
    c = AttnCell(kind, shape, cunorm=_res(cunorm, kind), reference="flash")
    for name, v in peers.items():
        c.peers[name] = v if isinstance(v, AttnResult) else _res(v, kind)
    return c


def _run() -> AttnRun:
    fwd = A.main_shapes([512, 16384], [64], ["bfloat16"])
    dec = A.decode_shapes([4096, 16384, 131072], [1], ["bfloat16"])
    run = AttnRun(["flash", "cudnn", "efficient", "default", "jax", "jax-cudnn"])
    run.forward = [
        _cell(fwd[0], "forward", 300.0, flash=265.0, cudnn=387.0, efficient=124.0, default=383.0,
              jax=_res(None, "forward", "n/a"), **{"jax-cudnn": 400.0}),
        _cell(fwd[1], "forward", 140.0, flash=153.0, cudnn=261.0, efficient=100.0, default=260.0,
              jax=_res(500.0, "forward", "MISMATCH"), **{"jax-cudnn": _res(None, "f", "n/a")}),
        _cell(fwd[2], "forward", 320.0, flash=306.0, cudnn=455.0, efficient=134.0, default=458.0),
        _cell(fwd[3], "forward", 330.0, flash=296.0, cudnn=445.0, efficient=128.0, default=437.0),
    ]  # fmt: skip
    run.decode = [
        _cell(dec[0], "decode", 2000.0, flash=1500.0, default=1600.0),
        _cell(dec[1], "decode", 3500.0, flash=2500.0, default=2600.0),
        _cell(dec[2], "decode", 2900.0, flash=3000.0, default=3100.0),
    ]
    base = {"shape": {}, "io_mb": 1073.7, "pool_growth_mb": 4.2, "status": "ok", "note": ""}
    run.memory = [
        {**base, "impl": "cunorm", "causal": False, "extra_mb": 4.2, "device_mb": 4.2},
        {**base, "impl": "cunorm", "causal": True, "extra_mb": 12.0, "device_mb": 2.0},
        {**base, "impl": "flash", "causal": False, "extra_mb": 4.2, "device_mb": None},
    ]
    run.notes = ["jax: n/a (bfloat16): refused"]
    return run


def test_cell_best_peer_and_ratios() -> None:
    run = _run()
    c0, c1 = run.forward[0], run.forward[1]
    assert c0.best_peer() == ("jax-cudnn", 400.0)
    assert c0.ratio("flash") == pytest.approx(300 / 265) and c0.ratio() == pytest.approx(0.75)
    # A MISMATCH never counts as best peer.
    assert c1.best_peer() == ("cudnn", 261.0)
    assert c1.ratio("jax") is None and c1.ratio("jax-cudnn") is None


def test_forward_and_decode_tables() -> None:
    run = _run()
    h, rows = R.forward_table(run)
    assert h[:6] == ["dtype", "D", "L", "B×H", "causal", "cunorm"]
    assert h[-4:] == ["best peer", "cunorm/best", "cunorm/FA2", "cunorm/cuDNN"]
    assert "jax" in h and "jax-cudnn" in h
    assert rows[0][:6] == ["bfloat16", "64", "512", "32×32", "no", "300"]
    assert rows[0][h.index("jax")] == "—" and rows[1][h.index("jax")] == "MISMATCH"
    assert rows[0][-3:] == ["0.75x", "1.13x", "0.78x"]
    h, rows = R.decode_table(run, 4000.0)
    assert h[:6] == ["dtype", "B", "Lk", "K/V MB", "cunorm µs", "cunorm GB/s"]
    assert "cudnn" not in h  # no decode cell has it
    assert rows[1][2] == "16384" and rows[1][3] == "67" and rows[1][-1] == "88%"
    h, rows = R.memory_table(run)
    assert rows[1][:4] == ["cunorm", "yes", "1073.7", "12.0"]


def test_summary_targets() -> None:
    s = R.summarize(_run(), 4000.0)
    fwd, dec, mem = s["targets"]
    assert fwd["verdict"] == "FAIL" and fwd["checked"] == 4
    assert fwd["failed"] == ["bf16 D64 L512 causal 0.915x"]
    # Lk >= 16384 only: 3500/4000 and 2900/4000 pass; Lk = 4096 is not checked.
    assert dec["verdict"] == "PASS" and dec["checked"] == 2
    assert mem["verdict"] == "FAIL" and mem["failed"] == ["causal 12.0 MB"]
    assert s["vs_cudnn"]["cells"] == 4 and s["vs_cudnn"]["at_least_1"] == 0
    assert s["guard_failures"][0]["impl"] == "jax"
    lines = R.summary_lines(s)
    assert lines[0].startswith("forward: at least 1.0x torch SDPA flash") and "FAIL" in lines[0]
    assert any(line.startswith("vs torch SDPA cuDNN") for line in lines)
    assert "correctness guard: cunorm matches in every cell checked" in lines
    assert any("jax bf16 D64 L512 causal" in line for line in lines)


def test_summary_decode_below_copy() -> None:
    run = _run()
    run.decode[2].cunorm.gbps = 2000.0
    dec = R.summarize(run, 4000.0)["targets"][1]
    assert dec["verdict"] == "FAIL" and dec["failed"] == ["bf16 B1 Lk131072 50.0%"]


def test_write_files(tmp_path: Path) -> None:
    meta = {"device": "NVIDIA H200", "slug": "nvidia-h200", "date": "2026-11-21",
            "versions": {"cunorm": "0.1.0", "torch": "2.11.0"}, "command": "python -m cunorm.bench "
            "attention", "copy_gbps": 4276.0, "timer": "do_bench"}  # fmt: skip
    run = _run()
    paths = R.write_attention_files(tmp_path, meta, run, R.summarize(run, 4276.0), plot=False)
    assert [p.name for p in paths] == [
        "nvidia-h200-2026-11-21-attention.md",
        "nvidia-h200-2026-11-21-attention.json",
    ]
    md = paths[0].read_text()
    for part in ("# cunorm attention benchmark, NVIDIA H200", "## Forward (TFLOP/s)",
                 "## Decoding (GB/s of K/V read)", "## Peak extra memory at L = 65536",
                 "## Summary", "## Notes", "| bfloat16 | 64 | 512 | 32×32 | no | 300 |",
                 "cudaMemGetInfo", "4·B·H·Lq·Lk·D"):  # fmt: skip
        assert part in md, part
    data = json.loads(paths[1].read_text())
    assert data["op"] == "attention" and len(data["forward"]) == 4 and len(data["decode"]) == 3
    assert data["forward"][0]["cunorm"]["tflops"] == 300.0
    assert data["forward"][0]["flops"] == A.attention_flops(32, 32, 512, 512, 64, False)


def test_device_uuid_in_header(monkeypatch: pytest.MonkeyPatch) -> None:
    import sys
    import types

    from cunorm.bench import report

    raw = bytes(range(16))
    props = {"uuid": raw}
    rt = types.SimpleNamespace(getDeviceProperties=lambda i: props)
    fake = types.SimpleNamespace(cuda=types.SimpleNamespace(runtime=rt))
    monkeypatch.setitem(sys.modules, "cupy", fake)
    uuid = env.device_uuid()
    assert uuid == "GPU-00010203-0405-0607-0809-0a0b0c0d0e0f"
    meta = {"device": "NVIDIA H200", "date": "2026-11-22", "versions": {}, "copy_gbps": 4228.0,
            "uuid": uuid}
    assert "Device: **NVIDIA H200** (GPU-00010203-0405-0607-0809-0a0b0c0d0e0f). " in "\n".join(
        report.header_lines(meta, "softmax", "m"))
    # CuPy cuts the runtime's bytes at a zero byte: the one nvidia-smi UUID continuing them
    # with a zero byte, none where two or none do
    smi = ["GPU-c9235576-001f-d34a-29bd-0e84d5a0cc79", "GPU-c9235576-011f-d34a-29bd-0e84d5a0cc79",
           "GPU-7b615079-0860-e7fc-52dd-d0f1a6168085"]
    monkeypatch.setattr(env, "_smi_uuids", lambda: smi)
    props["uuid"] = bytes.fromhex("c9235576")
    assert env.device_uuid() == "GPU-c9235576-001f-d34a-29bd-0e84d5a0cc79"
    smi.append("GPU-C9235576-0020-0000-0000-000000000000")
    assert env.device_uuid() == ""
    props["uuid"] = b""  # a runtime without one: no suffix
    assert env.device_uuid() == "" and report.uuid_suffix({"uuid": ""}) == ""
    assert "Device: **NVIDIA H200**. " in "\n".join(report.header_lines(
        {**meta, "uuid": env.device_uuid()}, "softmax", "m"))


def test_plot(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    meta = {"device": "NVIDIA H200", "date": "2026-11-21"}
    assert R.write_plot(tmp_path / "a.png", meta, _run())
    assert (tmp_path / "a.png").stat().st_size > 10_000
    assert R.plot_panels(_run()) == [("bfloat16", 64, False), ("bfloat16", 64, True)]
    assert not R.write_plot(tmp_path / "b.png", meta, AttnRun(["flash"]))


def test_opspec_defaults_unchanged() -> None:
    # The row-wise ops keep their family and rowwise flag; attention added no row-wise op.
    assert [op.name for op in rowwise_ops()] == [
        "softmax", "log_softmax", "layer_norm", "rms_norm", "layer_norm_residual",
        "rms_norm_residual", "softmax_backward", "log_softmax_backward", "layer_norm_backward",
        "rms_norm_backward",
    ]  # fmt: skip
    assert isinstance(OPS["softmax"], OpSpec) and OPS["softmax"].runner is None


def test_make_timer_rejects_unknown_choice() -> None:
    """An unknown --timer value is refused before anything touches the GPU."""
    from cunorm.bench.timing import make_timer

    with pytest.raises(ValueError, match="unknown timer 'bogus'; expected auto, padded"):
        make_timer("bogus")


# -- softmax_backward / log_softmax_backward (the softmax_grad family) ----------------------------
GRAD_OPS = ("softmax_backward", "log_softmax_backward")
NORM_GRAD_OPS = ("layer_norm_backward", "rms_norm_backward")


def _numpy_cupy() -> Any:
    """NumPy standing in for CuPy: enough of it for :func:`make_case` and the guard's float64
    check, so the GPU path's inputs and reference run on the CPU."""
    import types

    fake = types.ModuleType("cupy")
    fake.__dict__.update(
        __getattr__=lambda name: getattr(np, name),  # module __getattr__: the rest is NumPy's
        random=types.SimpleNamespace(RandomState=np.random.default_rng),
        cuda=types.SimpleNamespace(runtime=types.SimpleNamespace(deviceSynchronize=lambda: None)),
    )
    return fake


def _jacobian_product(y: np.ndarray, dy: np.ndarray, log: bool) -> np.ndarray:
    """dx = J^T dy row by row from the explicit Jacobian of (log_)softmax at output y."""
    dx = np.empty(y.shape)
    for i, (row, g) in enumerate(zip(y.astype(np.float64), dy.astype(np.float64), strict=True)):
        p = np.exp(row) if log else row
        jac = np.eye(p.size) - p[None, :] if log else np.diag(p) - np.outer(p, p)
        dx[i] = jac.T @ g
    return dx


def test_grad_op_entries() -> None:
    for name in GRAD_OPS:
        op = OPS[name]
        assert op.family == "softmax_grad" and op.cunorm_attr == name and op.rowwise
        assert op.log == name.startswith("log") and op.second_input and not op.residual
        assert op.arrays_moved == 3 and op.extra_cases == () and op.runner is None
        assert op.usage == f"`cunorm.{name}(y, dy, axis=axis)`"
        assert op in rowwise_ops()
        # 3 full-size arrays: y and dy read, dx written.
        assert op.moved_bytes(49152 * 1024, 2) == 3 * 49152 * 1024 * 2
    assert OPS["softmax_backward"].aten_grad == "_softmax_backward_data"
    assert OPS["log_softmax_backward"].aten_grad == "_log_softmax_backward_data"


@pytest.mark.parametrize("name", GRAD_OPS)
def test_grad_reference_is_the_jacobian_product(rng: np.random.Generator, name: str) -> None:
    op = OPS[name]
    x = rng.standard_normal((6, 37)) * 3
    y = op.forward_reference(np, x)
    if op.log:
        np.testing.assert_allclose(np.log(np.exp(y).sum(-1)), 0, atol=1e-14)
    else:
        assert (y > 0).all() and np.allclose(y.sum(-1), 1, rtol=1e-14)
    dy = rng.standard_normal(x.shape)
    ref = op.reference(np, y, r2d=dy)
    np.testing.assert_allclose(ref, _jacobian_product(y, dy, op.log), rtol=1e-12, atol=1e-14)
    # The direct formula, and cunorm's NumPy path on float64 inputs.
    if op.log:
        direct = dy - np.exp(y) * dy.sum(-1, keepdims=True)
    else:
        direct = y * (dy - (y * dy).sum(-1, keepdims=True))
    np.testing.assert_allclose(ref, direct, rtol=1e-14, atol=1e-15)
    fn, why = op.resolve()
    assert fn is not None, why
    np.testing.assert_allclose(op.call(fn, y, None, None, -1, dy), ref, rtol=1e-12, atol=1e-15)


@pytest.mark.parametrize("name", GRAD_OPS)
@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float32"])
def test_grad_case_and_guard(monkeypatch: pytest.MonkeyPatch, name: str, dtype: str) -> None:
    """make_case gives y = a real forward output rounded to the dtype and a random normal dy;
    the guard passes cunorm's result and catches a wrong one (float64 path, no torch)."""
    import sys

    from cunorm.bench import cases
    from cunorm.bench.ops import TOLERANCE, numpy_dtype

    monkeypatch.setitem(sys.modules, "cupy", _numpy_cupy())
    op = OPS[name]
    case = cases.make_case(op, (48, 300), dtype)
    y, dy = case.x, case.r
    assert y.dtype == dy.dtype == numpy_dtype(dtype) and y.shape == dy.shape == (48, 300)
    assert case.nbytes == 3 * y.size * y.dtype.itemsize
    assert np.count_nonzero(dy) == dy.size and float(dy.astype(np.float32).std()) > 0.9
    # y is the forward of random data, rounded: a real output within one rounding of the dtype
    # (for log_softmax, exp(y) carries the absolute rounding error of y: up to max|y| ulps).
    y64 = y.astype(np.float64)
    eps = {"float16": 2.0**-10, "bfloat16": 2.0**-7, "float32": 2.0**-23}[dtype]
    total = np.exp(y64).sum(-1) if op.log else y64.sum(-1)
    bound = eps * (np.abs(y64).max() if op.log else 1.0)
    assert np.abs(total - 1).max() <= bound
    assert len(np.unique(y)) > 100  # not a constant row
    fn, why = op.resolve()
    assert fn is not None, why
    good = cases.check_output(case, case.cunorm(fn), None)
    assert good.ok and good.err <= TOLERANCE[dtype], good
    assert "float64" in good.note
    bad = cases.check_output(case, dy, None)  # dx = dy: the sum term dropped
    assert not bad.ok and "vs float64" in bad.note


@pytest.mark.parametrize("name", GRAD_OPS)
def test_grad_peer_functions(name: str) -> None:
    """torch eager calls autograd's aten op as (dy, y, dim, y.dtype); the JAX function, run on
    NumPy as jnp, computes in float32 for float16 and returns y's dtype."""
    from types import SimpleNamespace

    op = OPS[name]
    calls = []
    aten = SimpleNamespace(**{op.aten_grad: lambda *a: calls.append(a) or "dx"})
    torch = SimpleNamespace(ops=SimpleNamespace(aten=aten), nn=SimpleNamespace(functional=None))
    y = SimpleNamespace(dtype="torch.float16")
    assert op.torch_fn(torch)(y, None, None, "dy", -1) == "dx"
    assert calls == [("dy", y, -1, "torch.float16")]

    rng = np.random.default_rng(0)
    y16 = op.forward_reference(np, rng.standard_normal((4, 64))).astype(np.float16)
    dy16 = rng.standard_normal((4, 64)).astype(np.float16)
    dx = op.jax_fn(SimpleNamespace(numpy=np), -1)(y16, None, None, dy16)
    assert dx.dtype == np.float16
    ref = op.reference(np, y16, r2d=dy16)
    err = np.abs(dx - ref).max(-1) / np.abs(ref).max(-1)
    assert err.max() < 2e-3


@pytest.mark.parametrize(("name", "cupyx_lacks"), [
    *((op, "no softmax gradient") for op in GRAD_OPS),
    *((op, "no norms and no norm gradient") for op in NORM_GRAD_OPS),
])
def test_grad_cupyx_and_triton_not_timed(name: str, cupyx_lacks: str) -> None:
    from types import SimpleNamespace

    from cunorm.bench.cases import Case
    from cunorm.bench.peers import Cupyx, PeerUnavailable, Triton

    triton = Triton.__new__(Triton)  # no torch, no GPU: build() refuses before either is used
    triton.k = SimpleNamespace(DTYPES=("float16", "bfloat16", "float32"), MAX_COLS=16384)
    case = Case(OPS[name], "float32", np.ones((2, 8), np.float32), r=np.ones((2, 8)))
    with pytest.raises(PeerUnavailable) as exc:
        Cupyx.__new__(Cupyx).build(case)
    assert str(exc.value) == f"cupyx.scipy.special has {cupyx_lacks}; {name} not timed"
    with pytest.raises(PeerUnavailable) as exc:
        triton.build(case)
    assert str(exc.value) == (
        f"the minimal Triton kernels are forward only (no backward); {name} not timed"
    )


def test_grad_method_paragraph() -> None:
    from cunorm.bench.report import method_paragraph

    text = method_paragraph({"timer": "events"}, "softmax_backward")
    for part in ("3·rows·cols·itemsize", "y and dy read, dx written",
                 "`torch.ops.aten._softmax_backward_data(dy, y, dim, y.dtype)`",
                 "`cunorm.softmax_backward(y, dy, axis=axis)`", "y = softmax of random normal",
                 "dx = y·(dy − Σ y·dy)", "triton: not timed", "cupyx: not timed"):  # fmt: skip
        assert part in text, part
    text = method_paragraph({"timer": "events"}, "log_softmax_backward")
    assert "_log_softmax_backward_data" in text and "dx = dy − exp(y)·Σdy" in text
    # The other ops keep their text.
    assert "cupyx: `cupyx.scipy.special`" in method_paragraph({"timer": "events"}, "softmax")


def _without_sums(op: Any) -> Any:
    """An implementation of a gradient op that drops its row sums: the guard must call it a
    MISMATCH."""
    if op.family == "softmax_grad":
        return lambda y, dy, axis: dy

    def no_sums(dy: Any, x: Any, *rest: Any, axis: int = -1) -> Any:
        return (dy, rest[-1]) if op.rms else (dy, rest[-1], rest[-1])

    return no_sums


@pytest.mark.parametrize("name", [*GRAD_OPS, *NORM_GRAD_OPS])
def test_grad_numpy_fallback(name: str) -> None:
    from cunorm.bench.sweep import Notes, run_numpy
    from cunorm.bench.timing import gbps

    op = OPS[name]
    fn, why = op.resolve()
    assert fn is not None, why
    notes = Notes()
    notes.sink = lambda m: None
    rows = run_numpy(op, fn, [32, 1000], notes)
    assert [r["status"] for r in rows] == ["ok", "ok"] and not notes.lines
    for r in rows:
        assert r["err"] < 2e-6 and r["gbps"] == gbps(3 * r["rows"] * r["cols"] * 4, r["ms"])
    rows = run_numpy(op, _without_sums(op), [32], notes)
    assert rows[0]["status"] == "MISMATCH" and "MISMATCH" in notes.lines[0]
    if op.family == "norm_grad":  # dx alone, not the tuple
        rows = run_numpy(op, lambda dy, x, *rest, axis=-1: dy, [32], notes)
        assert rows[0]["status"] == "ERROR" and "expected (dx, dweight" in rows[0]["note"]


def test_grad_no_gpu_command(monkeypatch: pytest.MonkeyPatch, capsys: Any) -> None:
    import cunorm

    monkeypatch.setattr(env, "probe_gpu", lambda: (False, "test: no GPU"))
    for name in GRAD_OPS:
        assert main([name, "--cols", "32,128"]) == 0
        out = capsys.readouterr().out
        rows = [line.split() for line in out.splitlines() if line.startswith(name)]
        assert [r[2] for r in rows] == ["32", "128"] and all(r[-1] == "ok" for r in rows)
    monkeypatch.delattr(cunorm, "softmax_backward")
    assert main(["softmax_backward", "--quick"]) == 2
    assert "cunorm.softmax_backward is not available yet" in capsys.readouterr().out


# -- layer_norm_backward / rms_norm_backward (the norm_grad family) --------------------------------


def _fd_grad(op: OpSpec, x: np.ndarray, w: np.ndarray, b: Any, dy: np.ndarray) -> np.ndarray:
    """dx = J^T dy of the float64 forward (the norm family's reference), by central differences
    column by column (rows are independent)."""
    fwd = OPS["rms_norm" if op.rms else "layer_norm"]
    h = 1e-6
    dx = np.empty(x.shape)
    for j in range(x.shape[1]):
        e = np.zeros(x.shape)
        e[:, j] = h
        dy_dxj = (fwd.reference(np, x + e, w, b) - fwd.reference(np, x - e, w, b)) / (2 * h)
        dx[:, j] = (dy_dxj * dy).sum(-1)
    return dx


def test_norm_grad_op_entries() -> None:
    for name in NORM_GRAD_OPS:
        op = OPS[name]
        assert op.family == "norm_grad" and op.cunorm_attr == name and op.rowwise
        assert op.rms == name.startswith("rms") and op.second_input and op.grad
        assert not op.residual and op.extra_cases == () and op.runner is None
        assert op.arrays_moved == 3 and op in rowwise_ops()
        # 3 full-size arrays: x and dy read, dx written (weight, stats, dweight not counted).
        assert op.moved_bytes(49152 * 1024, 2) == 3 * 49152 * 1024 * 2
    ln, rms = OPS["layer_norm_backward"], OPS["rms_norm_backward"]
    assert ln.params == ("weight", "bias") and ln.eps == OPS["layer_norm"].eps
    assert rms.params == ("weight",) and rms.eps == OPS["rms_norm"].eps
    assert ln.grad_outputs == ("dx", "dweight", "dbias") and ln.forward_attr == "layer_norm"
    assert rms.grad_outputs == ("dx", "dweight") and rms.forward_attr == "rms_norm"
    assert ln.usage.startswith("`cunorm.layer_norm_backward(dy, x, mean, rstd, w, axis=axis)`")
    assert "`cunorm.layer_norm(x, w, b, eps=1e-05, return_stats=True)`" in ln.usage
    assert rms.usage.startswith("`cunorm.rms_norm_backward(dy, x, rstd, w, axis=axis)`")
    assert "`cunorm.rms_norm(x, w, eps=1e-06, return_stats=True)`" in rms.usage
    # The softmax gradients are gradients too; the forward ops are not.
    assert OPS["softmax_backward"].grad and not OPS["layer_norm"].grad


@pytest.mark.parametrize("name", NORM_GRAD_OPS)
def test_norm_grad_reference(rng: np.random.Generator, name: str) -> None:
    """The float64 reference is J^T dy of the forward, and what cunorm's NumPy path returns on
    float64 inputs with the statistics of cunorm's forward."""
    op = OPS[name]
    x = rng.standard_normal((5, 9)) * 2 + 0.5
    w = rng.standard_normal(9)
    b = None if op.rms else rng.standard_normal(9)
    dy = rng.standard_normal(x.shape)
    ref = op.reference(np, x, w, b, dy)
    np.testing.assert_allclose(ref, _fd_grad(op, x, w, b, dy), rtol=1e-6, atol=1e-7)
    xhat = x if op.rms else x - x.mean(-1, keepdims=True)
    rstd = 1 / np.sqrt((xhat * xhat).mean(-1, keepdims=True) + op.eps)
    xhat = xhat * rstd
    g = dy * w
    direct = rstd * (g - (0 if op.rms else g.mean(-1, keepdims=True))
                     - xhat * (g * xhat).mean(-1, keepdims=True))  # fmt: skip
    np.testing.assert_allclose(ref, direct, rtol=1e-13, atol=1e-14)
    fn, why = op.resolve()
    assert fn is not None, why
    stats = op.cunorm_stats(x, w, b, -1)
    assert len(stats) == (1 if op.rms else 2) and all(s.shape == (5,) for s in stats)
    out = op.call(fn, x, w, b, -1, dy, stats)
    assert len(out) == len(op.grad_outputs)
    np.testing.assert_allclose(out[0], ref, rtol=1e-12, atol=1e-13)
    np.testing.assert_allclose(out[1], (dy * xhat).sum(0), rtol=1e-12)
    if not op.rms:
        np.testing.assert_allclose(out[2], dy.sum(0), rtol=1e-12)


@pytest.mark.parametrize("name", NORM_GRAD_OPS)
@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float32"])
def test_norm_grad_case_and_guard(monkeypatch: pytest.MonkeyPatch, name: str, dtype: str) -> None:
    """make_case gives x, weight (and bias) and a random normal dy; cunorm gets the statistics
    of its own forward, once; the guard passes cunorm's result and catches wrong ones."""
    import sys

    from cunorm.bench import cases
    from cunorm.bench.ops import TOLERANCE, numpy_dtype

    monkeypatch.setitem(sys.modules, "cupy", _numpy_cupy())
    op = OPS[name]
    case = cases.make_case(op, (48, 300), dtype)
    x, dy = case.x, case.r
    assert x.dtype == dy.dtype == numpy_dtype(dtype) and x.shape == dy.shape == (48, 300)
    assert case.w.shape == (300,) and case.w.dtype == x.dtype
    assert (case.b is None) == op.rms
    # x, w, b are the forward op's (same seed, same draws).
    plain = cases.make_case(OPS[op.forward_attr], (48, 300), dtype)
    assert (plain.x == x).all() and (plain.w == case.w).all()
    assert case.nbytes == 3 * x.size * x.dtype.itemsize
    assert np.count_nonzero(dy) == dy.size and float(dy.astype(np.float32).std()) > 0.9
    fn, why = op.resolve()
    assert fn is not None, why
    out = case.cunorm(fn)
    stats = case.cunorm_stats()
    assert case.cunorm_stats() is stats  # computed once, kept for the timed calls
    assert all(s.dtype == np.float32 and s.shape == (48,) for s in stats)
    good = cases.check_output(case, out, None)
    assert good.ok and good.err <= TOLERANCE[dtype], good
    assert "float64" in good.note
    bad = cases.check_output(case, (dy, *out[1:]), None)  # dx = dy
    assert not bad.ok and "vs float64" in bad.note
    short = cases.check_output(case, out[:1], None)
    assert not short.ok and short.note == (
        f"expected ({', '.join(op.grad_outputs)}), got a 1-tuple"
    )
    wrong = cases.check_output(case, (out[0], out[1][:5], *out[2:]), None)
    assert not wrong.ok and wrong.note == "dweight is shape (5,), expected (300,)"


def test_norm_grad_resolve_needs_return_stats(monkeypatch: pytest.MonkeyPatch) -> None:
    import cunorm

    monkeypatch.setattr(cunorm, "rms_norm", lambda x, w=None, *, axis=-1, eps=1e-6: x)
    fn, why = OPS["rms_norm_backward"].resolve()
    assert fn is None and "cunorm.rms_norm does not return its statistics" in why
    assert OPS["layer_norm_backward"].resolve()[0] is not None
    monkeypatch.delattr(cunorm, "layer_norm_backward")
    fn, why = OPS["layer_norm_backward"].resolve()
    assert fn is None and "not available yet" in why


def test_norm_grad_torch_calls() -> None:
    """torch eager runs autograd's aten ops on torch's own statistics (a fake torch records the
    calls): native_layer_norm(_backward), and _fused_rms_norm(_backward) where they run."""
    from types import SimpleNamespace

    from cunorm.bench import ops

    calls = []

    def rec(name: str, result: Any) -> Any:
        return lambda *a: calls.append((name, *a)) or result

    aten = SimpleNamespace(
        native_layer_norm=rec("fwd", ("y", "mean", "rstd")),
        native_layer_norm_backward=rec("bwd", ("dx", "dw", "db")),
        _fused_rms_norm=rec("rfwd", ("y", "rstd")),
        _fused_rms_norm_backward=rec("rbwd", ("dx", "dw")),
    )
    torch = SimpleNamespace(
        ops=SimpleNamespace(aten=aten), nn=SimpleNamespace(functional=None),
        cuda=SimpleNamespace(is_available=lambda: False), ones=lambda *a, **k: np.ones(a[0]),
    )  # fmt: skip
    t = np.zeros((4, 8))
    ln, rms = OPS["layer_norm_backward"], OPS["rms_norm_backward"]
    stats = ln.torch_stats(torch, t, "w", "b")
    assert stats == ("mean", "rstd") and calls == [("fwd", t, [8], "w", "b", 1e-5)]
    assert ln.torch_fn(torch)(t, "w", "b", "dy", -1, stats) == ("dx", "dw", "db")
    assert calls[-1] == ("bwd", "dy", t, [8], "mean", "rstd", "w", "b", [True, True, True])
    calls.clear()
    assert ops.torch_fused_rms(torch)  # the probe ran both ops
    assert [c[0] for c in calls] == ["rfwd", "rbwd"]
    stats = rms.torch_stats(torch, t, "w", None)
    assert stats == ("rstd",) and calls[-1] == ("rfwd", t, [8], "w", 1e-6)
    assert rms.torch_fn(torch)(t, "w", None, "dy", -1, stats) == ("dx", "dw")
    assert calls[-1] == ("rbwd", "dy", t, [8], "rstd", "w", [True, True])
    assert rms.torch_grad_label(torch).startswith("torch.ops.aten._fused_rms_norm_backward(")
    assert ln.torch_grad_label(torch).startswith("torch.ops.aten.native_layer_norm_backward(")
    # A torch without the fused rms ops: the formula, said so in the label.
    old = SimpleNamespace(ops=SimpleNamespace(aten=SimpleNamespace()))
    assert not ops.torch_fused_rms(old)
    assert "has no CUDA aten._fused_rms_norm_backward" in rms.torch_grad_label(old)


@pytest.mark.parametrize("name", NORM_GRAD_OPS)
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_norm_grad_torch_on_cpu(rng: np.random.Generator, name: str, dtype: str) -> None:
    """The real torch functions on CPU tensors (on a CPU, torch has no _fused_rms_norm_backward
    kernel, so rms_norm takes the formula) against the float64 reference."""
    torch = pytest.importorskip("torch")
    from cunorm.bench import ops

    op = OPS[name]
    x = torch.from_numpy(rng.standard_normal((6, 40)).astype(dtype))
    w = torch.from_numpy(rng.standard_normal(40).astype(dtype))
    b = None if op.rms else torch.from_numpy(rng.standard_normal(40).astype(dtype))
    dy = torch.from_numpy(rng.standard_normal((6, 40)).astype(dtype))
    if op.rms and ops.torch_fused_rms(torch):
        pytest.skip("this torch runs _fused_rms_norm_backward on the CPU")
    stats = op.torch_stats(torch, x, w, b)
    assert all(s.shape == (6, 1) for s in stats)
    out = op.torch_fn(torch)(x, w, b, dy, -1, stats)
    assert len(out) == len(op.grad_outputs) and out[0].dtype == x.dtype
    assert all(tuple(o.shape) == (40,) and o.dtype == x.dtype for o in out[1:])
    ref = op.reference(np, x.numpy(), w.numpy(), None, dy.numpy())
    tol = 2e-6 if dtype == "float32" else 1e-12
    assert np.abs(out[0].numpy() - ref).max() <= tol * np.abs(ref).max()


def _fd_jax() -> Any:
    """A stand-in for ``jax`` on NumPy float64: ``numpy`` and ``lax.rsqrt`` for the forward, and
    ``vjp`` by central differences, enough to run :meth:`OpSpec.jax_fn`'s function."""
    from types import SimpleNamespace

    def vjp(f: Any, *primals: np.ndarray) -> Any:
        def pull(ct: np.ndarray) -> tuple[np.ndarray, ...]:
            grads = []
            for i, p in enumerate(primals):
                g = np.empty(p.shape)
                for idx in np.ndindex(p.shape):
                    e = np.zeros(p.shape)
                    e[idx] = 1e-6
                    hi = [*primals[:i], p + e, *primals[i + 1 :]]
                    lo = [*primals[:i], p - e, *primals[i + 1 :]]
                    g[idx] = ((f(*hi) - f(*lo)) * ct).sum() / 2e-6
                grads.append(g)
            return tuple(grads)

        return f(*primals), pull

    return SimpleNamespace(numpy=np, lax=SimpleNamespace(rsqrt=lambda a: 1 / np.sqrt(a)), vjp=vjp)


@pytest.mark.parametrize("name", NORM_GRAD_OPS)
def test_norm_grad_jax_function(rng: np.random.Generator, name: str) -> None:
    """JAX's function is jax.vjp of the jnp norm with respect to x, w (and b), applied to dy."""
    op = OPS[name]
    x, dy = rng.standard_normal((3, 6)), rng.standard_normal((3, 6))
    w = rng.standard_normal(6)
    b = None if op.rms else rng.standard_normal(6)
    out = op.jax_fn(_fd_jax(), -1)(x, w, b, dy)
    assert len(out) == len(op.grad_outputs)
    np.testing.assert_allclose(out[0], op.reference(np, x, w, b, dy), rtol=1e-6, atol=1e-7)
    xc = x if op.rms else x - x.mean(-1, keepdims=True)
    xhat = xc / np.sqrt((xc * xc).mean(-1, keepdims=True) + op.eps)
    np.testing.assert_allclose(out[1], (dy * xhat).sum(0), rtol=1e-6, atol=1e-7)
    if not op.rms:
        np.testing.assert_allclose(out[2], dy.sum(0), rtol=1e-6, atol=1e-7)


def test_norm_grad_peer_notes() -> None:
    """The torch peers' callables for rms_norm_backward say which backward they run."""
    from types import SimpleNamespace

    from cunorm.bench.cases import Case
    from cunorm.bench.peers import _with_note

    old = SimpleNamespace(ops=SimpleNamespace(aten=SimpleNamespace()))
    for name in NORM_GRAD_OPS:
        case = Case(OPS[name], "float32", np.ones((2, 8), np.float32))
        case._torch = ("t", "w", "b", "dy")
        case._torch_stats = ("rstd",)
        fn = _with_note(case, old, lambda *a: a)
        assert fn() == ("t", "w", "b", "dy", -1, ("rstd",))
        note = getattr(fn, "note", "")
        assert ("has no CUDA aten._fused_rms_norm_backward" in note) == OPS[name].rms


def test_fused_rms_probe_not_fooled_by_a_reused_id() -> None:
    """torch_fused_rms's cache answers for the object it probed, not for a later object that
    got the same id (a dead stand-in's answer once failed test_norm_grad_peer_notes in CI)."""
    from types import SimpleNamespace

    from cunorm.bench import ops

    no_fused = SimpleNamespace(ops=SimpleNamespace(aten=SimpleNamespace()))
    ops._FUSED_RMS[id(no_fused)] = (object(), True)  # as if a dead object held this id
    try:
        assert ops.torch_fused_rms(no_fused) is False
        assert ops._FUSED_RMS[id(no_fused)] == (no_fused, False)
    finally:
        del ops._FUSED_RMS[id(no_fused)]


def test_norm_grad_method_paragraph() -> None:
    from cunorm.bench.report import method_paragraph

    text = method_paragraph({"timer": "events"}, "layer_norm_backward")
    for part in ("3·rows·cols·itemsize", "x and dy read, dx written",
                 "`torch.ops.aten.native_layer_norm_backward(dy, x, [cols], mean, rstd, w, b, "
                 "[True, True, True])`", "`aten.native_layer_norm`",
                 "`cunorm.layer_norm_backward(dy, x, mean, rstd, w, axis=axis)`",
                 "return_stats=True", "random normal x, weight, bias and dy", "`jax.vjp`",
                 "dx = rstd·(g − mean(g) − x̂·mean(g·x̂))", "triton: not timed",
                 "cupyx: not timed"):  # fmt: skip
        assert part in text, part
    text = method_paragraph({"timer": "events"}, "rms_norm_backward")
    for part in ("`torch.ops.aten._fused_rms_norm_backward(dy, x, [cols], rstd, w, [True, True])`",
                 "formula in float32 torch ops", "dx = rstd·(g − x̂·mean(g·x̂))",
                 "random normal x, weight and dy", "of dweight only the shape"):  # fmt: skip
        assert part in text, part


def test_norm_grad_no_gpu_command(monkeypatch: pytest.MonkeyPatch, capsys: Any) -> None:
    import cunorm

    monkeypatch.setattr(env, "probe_gpu", lambda: (False, "test: no GPU"))
    for name in NORM_GRAD_OPS:
        assert main([name, "--cols", "32,128"]) == 0
        out = capsys.readouterr().out
        rows = [line.split() for line in out.splitlines() if line.startswith(name)]
        assert [r[2] for r in rows] == ["32", "128"] and all(r[-1] == "ok" for r in rows)
    monkeypatch.delattr(cunorm, "rms_norm_backward")
    assert main(["rms_norm_backward", "--quick"]) == 2
    assert "cunorm.rms_norm_backward is not available yet" in capsys.readouterr().out
