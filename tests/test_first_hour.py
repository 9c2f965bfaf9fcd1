"""Issue 18, the first hour of a new user: each numbered item has a CPU test here.

1 bootstrap checks the install from outside the repo; 3 every README ``python`` block runs; 4 load_quantized
warns when the requested dtype cannot hold the checkpoint's; 5 a missing directory is a FileNotFoundError naming
it; 6 inspect with an unknown preset: one line, exit 2; 7 replace_linear's warning gives the reasons with counts;
8 the benchmark's CPU baseline is labelled torch's CPU matmul; 9 the demo with an impossible backend: one line,
exit 2; 10 the doctor report.  (Item 2, the README timings, is a dated measurement, not a test.)
"""
from __future__ import annotations

import os
import re
import subprocess
import sys
import warnings

import pytest
import torch

import humming_triton as ht

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _env_without_interpreter() -> dict:
    """The CLI as a user runs it: conftest's TRITON_INTERPRET=1 removed, the checkout on the path."""
    env = dict(os.environ)
    env.pop("TRITON_INTERPRET", None)
    env["PYTHONPATH"] = ROOT + os.pathsep + env.get("PYTHONPATH", "")
    return env


def _tiny_llama(dtype=None):
    transformers = pytest.importorskip("transformers")
    pytest.importorskip("safetensors")
    cfg = transformers.LlamaConfig(vocab_size=128, hidden_size=128, intermediate_size=256, num_hidden_layers=1,
                                   num_attention_heads=2, num_key_value_heads=1, head_dim=64,
                                   max_position_embeddings=64)
    torch.manual_seed(0)
    kw = {"dtype": dtype} if dtype is not None else {}
    return transformers.AutoModelForCausalLM.from_config(cfg, **kw).eval()


def _our_warnings(caught) -> list[str]:
    return [str(w.message) for w in caught if "humming_triton" in str(w.message)]


# --- 1: bootstrap installs the package and checks it from outside the repo -------------------------------------

def _venv(path, pth: list[str] | None = None) -> str:
    """A bare venv (no pip: fast, installs nothing); ``pth``: folders put on its path, as an editable install
    puts the checkout there.  (Not --system-site-packages: run from a venv, that would be the base Python's.)"""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(path)], check=True, timeout=60)
    py = os.path.join(str(path), "bin", "python")
    if pth:
        site = subprocess.run([py, "-c", "import site; print(site.getsitepackages()[0])"], capture_output=True,
                              text=True, check=True).stdout.strip()
        with open(os.path.join(site, "checkout.pth"), "w") as f:
            f.write("\n".join(pth) + "\n")
    return py


def _check_install(py: str):
    env = dict(os.environ, PYTHON=py, PYTHONPATH=ROOT)  # the check must ignore PYTHONPATH
    return subprocess.run(["bash", os.path.join(ROOT, "scripts", "bootstrap.sh"), "--check-install"], cwd=ROOT,
                          env=env, capture_output=True, text=True, timeout=120)


def test_bootstrap_install_check_runs_outside_the_repo(tmp_path):
    # not installed: from the repo root `import humming_triton` would pass through the current folder; the
    # check (from /, PYTHONPATH ignored) must say it is not installed
    p = _check_install(_venv(tmp_path / "bare"))
    assert p.returncode == 1, p.stdout + p.stderr
    assert "not importable outside the repo" in p.stdout
    # "installed" (the checkout on the venv's path, as pip install -e . does; torch from this process's
    # site-packages): passes
    deps = [d for d in sys.path if d.endswith(("site-packages", "dist-packages"))]
    p = _check_install(_venv(tmp_path / "installed", pth=[ROOT, *deps]))
    assert p.returncode == 0, p.stdout + p.stderr
    assert "installed for" in p.stdout
    # importable, but another copy: not this checkout
    other = tmp_path / "other"
    (other / "humming_triton").mkdir(parents=True)
    (other / "humming_triton" / "__init__.py").write_text("")
    p = _check_install(_venv(tmp_path / "elsewhere", pth=[str(other)]))
    assert p.returncode == 1 and "not from this checkout" in p.stdout, p.stdout + p.stderr


def test_bootstrap_installs_through_the_outside_check():
    """The install step is decided by the outside-the-repo check, never by a bare import in the repo root."""
    text = open(os.path.join(ROOT, "scripts", "bootstrap.sh")).read()
    assert 'if ! why=$(install_problem); then' in text and "-e ." in text
    assert not re.search(r'"\$PY" -c "import humming_triton"', text)


# --- 3: every python block of the README runs --------------------------------------------------------------------

NEEDS_CHECKPOINT = "# needs a checkpoint"  # a README line ending with this is not run (none do today)


def readme_python_blocks() -> list[str]:
    with open(os.path.join(ROOT, "README.md")) as f:
        text = f.read()
    blocks = re.findall(r"^```python\n(.*?)^```", text, flags=re.S | re.M)
    return ["\n".join(line for line in b.splitlines() if not line.rstrip().endswith(NEEDS_CHECKPOINT))
            for b in blocks]


def _readme_names() -> dict:
    """Small inputs for the names the README blocks use (N=256, K=512; 4 experts, hidden 128, intermediate 128)."""
    g = torch.Generator().manual_seed(0)
    e, h, i, t, topk = 4, 128, 128, 6, 2
    topk_ids = torch.stack([torch.randperm(e, generator=g)[:topk] for _ in range(t)])
    return dict(
        w=torch.randn(256, 512, generator=g) * 0.02, x=torch.randn(4, 512, generator=g),
        w_experts=torch.randn(e, 256, 512, generator=g) * 0.02, x_sorted=torch.randn(8, 512, generator=g),
        offsets=torch.tensor([0, 2, 2, 5, 8], dtype=torch.int32),
        hidden=torch.randn(t, h, generator=g),
        w13=ht.quantize_weight(torch.randn(e, 2 * i, h, generator=g) * 0.02, "w4a16"),
        w2=ht.quantize_weight(torch.randn(e, h, i, generator=g) * 0.02, "w4a16"),
        topk_weights=torch.rand(t, topk, generator=g).softmax(-1), topk_ids=topk_ids,
        model=_tiny_llama(torch.bfloat16),
    )


def test_readme_python_blocks_run(tmp_path, monkeypatch):
    blocks = readme_python_blocks()
    assert blocks, "README.md has no python block"
    monkeypatch.chdir(tmp_path)  # blocks may write (save_quantized "out")
    for i, code in enumerate(blocks):
        ns = _readme_names()
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            exec(compile(code, f"README.md python block {i + 1}", "exec"), ns)  # noqa: S102
        assert not _our_warnings(caught), _our_warnings(caught)  # a README example warns about nothing
    # the usage block did what it says
    assert isinstance(ns["q"], ht.QuantActivation)
    assert any(isinstance(m, ht.QuantLinear) for m in ns["model"].modules())


# --- 4: load_quantized and the checkpoint's dtype ------------------------------------------------------------------

def _saved(tmp_path, dtype=None) -> tuple[torch.nn.Module, str]:
    model = _tiny_llama(dtype)
    ht.replace_linear(model, "w4a16", backend="reference")
    d = str(tmp_path / "ckpt")
    ht.save_quantized(model, d, format="gptq")
    return model, d


def test_load_quantized_warns_when_dtype_loses_exactness(tmp_path):
    model, d = _saved(tmp_path)  # fp32 (a model built without dtype records none: its tensors say fp32)
    with pytest.warns(UserWarning, match=r"saved in float32 and is loaded as dtype=bfloat16.*dtype=torch\.float32"):
        ht.load_quantized(d, dtype=torch.bfloat16, backend="reference")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        loaded = ht.load_quantized(d, dtype=torch.float32, backend="reference")
    assert not _our_warnings(caught)
    ids = torch.randint(1, 128, (1, 6))
    with torch.no_grad():
        assert torch.equal(model(ids).logits, loaded(ids).logits)  # the same dtype: exact


def test_load_quantized_widening_is_silent(tmp_path):
    _, d = _saved(tmp_path, torch.bfloat16)  # config.json records bfloat16; fp32 holds every bf16 value
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        ht.load_quantized(d, dtype=torch.float32, backend="reference")
        ht.load_quantized(d, dtype=torch.bfloat16, backend="reference")
    assert not _our_warnings(caught)
    with pytest.warns(UserWarning, match="saved in bfloat16 and is loaded as dtype=float16"):
        ht.load_quantized(d, dtype=torch.float16, backend="reference")


def test_recorded_dtype_and_exact_cast(tmp_path):
    from humming_triton.checkpoints.loader import exact_cast, recorded_dtype
    for cfg, want in (('{"torch_dtype": "float16"}', torch.float16), ('{"dtype": "bfloat16"}', torch.bfloat16),
                      ('{"dtype": null}', None), ('{"torch_dtype": "auto"}', None), ("{}", None)):
        (tmp_path / "config.json").write_text(cfg)
        assert recorded_dtype(str(tmp_path)) == want, cfg
    assert exact_cast(torch.bfloat16, torch.float32) and exact_cast(torch.float16, torch.float32)
    assert not exact_cast(torch.float32, torch.bfloat16) and not exact_cast(torch.float16, torch.bfloat16)
    assert not exact_cast(torch.bfloat16, torch.float16)


# --- 5: a missing local path --------------------------------------------------------------------------------------

@pytest.mark.parametrize("fn", [ht.load_quantized, ht.read_quantized_tensors])
def test_missing_directory_is_file_not_found(tmp_path, monkeypatch, fn):
    missing = str(tmp_path / "does-not-exist")
    with pytest.raises(FileNotFoundError, match=f"{re.escape(missing)} does not exist"):
        fn(missing)
    monkeypatch.chdir(tmp_path)
    with pytest.raises(FileNotFoundError, match=r"\./nope does not exist"):
        fn("./nope")
    with pytest.raises(FileNotFoundError, match="not a local directory"):
        fn("some-model")  # reads like a hub id: we do not download, and say so


# --- 6: inspect with an unknown preset -----------------------------------------------------------------------------

def test_inspect_unknown_preset_one_line_exit_2():
    p = subprocess.run([sys.executable, "-m", "humming_triton.kernels.inspect", "w4a17"], cwd=ROOT,
                       env=_env_without_interpreter(), capture_output=True, text=True, timeout=120)
    assert p.returncode == 2, p.stdout + p.stderr
    assert p.stdout == ""
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and "unknown quantization preset 'w4a17'" in lines[0], p.stderr


# --- 7: replace_linear says why it replaced nothing ---------------------------------------------------------------

def test_replace_nothing_warning_groups_reasons():
    net = torch.nn.Sequential(torch.nn.Linear(500, 500), torch.nn.Linear(500, 300), torch.nn.Linear(300, 8))
    with pytest.warns(UserWarning, match="replaced nothing") as rec:
        ht.replace_linear(net, "w4a16", skip=("2",), backend="reference")
    msg = str(rec[0].message)
    assert "2 x group size 128 does not divide K=500" in msg and "1 x skip pattern" in msg, msg
    assert net._humming_triton_report.skip_summary() in msg


# --- 8: the benchmark labels what ran -----------------------------------------------------------------------------

def test_interpret_benchmark_labels_cpu_matmul(tmp_path):
    from benchmarks import peers, report
    from benchmarks.runner import DenseCase, method_label, run_cases
    assert method_label("cublas", True, torch.bfloat16) == "torch CPU matmul (bf16)"
    assert method_label("cublas", False, torch.bfloat16) == "cuBLAS bf16"
    recs = run_cases([DenseCase("w4a16", 64, 256, 1)], suite="interpret", selected={"humming_triton", "cublas"},
                     device="cpu", our_backend="reference", budget=peers.PeerBudget({}), ceilings={},
                     log=lambda s: None)
    assert {r["method"]: r["label"] for r in recs} == {"humming_triton": "ours", "cublas": "torch CPU matmul (bf16)"}
    meta = dict(device="cpu", suite="interpret", date="today", torch="t", triton="t", git_commit="c")
    text = report.write_markdown(str(tmp_path / "results.md"), meta, recs, [])
    assert "torch CPU matmul (bf16)" in text and "cuBLAS" not in text.split("## Dense")[1]
    # the plot legend takes the same names; files written before rows had labels keep the old names
    assert report.method_names(recs)["cublas"] == "torch CPU matmul (bf16)"
    assert report.method_names([{"method": "cublas"}])["cublas"] == "cuBLAS bf16"


# --- 9: the demo with a backend that cannot run here ---------------------------------------------------------------

@pytest.mark.skipif(torch.cuda.is_available(), reason="on a GPU machine --backend triton runs")
def test_demo_impossible_backend_one_line_exit_2():
    p = subprocess.run([sys.executable, "-m", "humming_triton.demo", "--backend", "triton"], cwd=ROOT,
                       env=_env_without_interpreter(), capture_output=True, text=True, timeout=120)
    assert p.returncode == 2, p.stdout + p.stderr
    assert "Traceback" not in p.stderr and p.stdout == ""
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and "--backend triton cannot run on cpu" in lines[0] and "CUDA" in lines[0], p.stderr


# --- 10: the doctor ------------------------------------------------------------------------------------------------

def test_doctor_report_on_cpu():
    from humming_triton import backends, capability, doctor
    from humming_triton.kernels import families
    text = doctor.report()
    for needle in ("python ", f"torch           {torch.__version__}", "triton ", "humming_triton  ",
                   f"CUDA available  {torch.cuda.is_available()}", "SM count", "TRITON_INTERPRET",
                   "measured dispatch table"):
        assert needle in text, needle
    for kind in capability.MMA_KINDS:
        assert re.search(rf"^  {kind} +(yes|no: )", text, flags=re.M), kind
    for name in backends.registered():
        assert re.search(rf"^  {name} +(runs|no: )", text, flags=re.M), name
    for fam in families.registered():
        assert f"{fam.backend}/{fam.name} ({fam.op})" in text, fam.name
    if not torch.cuda.is_available():
        assert "none: no CUDA device" in text


def test_doctor_reports_the_table_of_a_posed_gpu():
    import json

    from humming_triton import capability, dispatch, doctor
    path = dispatch.table_path("h200")
    entries = len(json.loads(path.read_text())["dispatch"])
    with capability.pose_as((9, 0)):
        text = doctor.report()
    assert f"{path} ({entries} entries in its dispatch section)" in text
    with capability.pose_as((8, 0)):
        text = doctor.report()
    assert "a100_sxm4_80gb.json does not exist" in text and "fp8          no: " in text


def test_doctor_never_crashes(monkeypatch):
    from humming_triton import capability, doctor

    def broken(*a, **k):
        raise RuntimeError("no driver")
    monkeypatch.setattr(capability, "device_facts", broken)
    text = doctor.report()
    assert "error: RuntimeError: no driver" in text and "versions" in text


def test_doctor_cli():
    p = subprocess.run([sys.executable, "-m", "humming_triton.doctor"], cwd=ROOT, env=_env_without_interpreter(),
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 0 and "humming_triton doctor" in p.stdout and "Traceback" not in p.stderr, p.stderr
