"""The switches of paths that are not the default everywhere (humming_triton/switches.py): the environment, then
``set_enabled``, then the device's measured table; and the committed tables' ``switches`` sections themselves."""
import copy
import json
import re
from pathlib import Path

import pytest
import torch

import humming_triton as ht
from cutlass_ext import native_op
from humming_triton import capability, dispatch, switches
from humming_triton.kernels import compiled, moe
from humming_triton.nn import QuantLinear

SWITCHES = {"native_op": native_op, "moe_pipeline": moe, "compile_triton": compiled}
TABLES = Path(__file__).resolve().parents[1] / "autotune_configs"


def _on(module, tokens: int = 1, scheme: str = "w4a16") -> bool:
    return module.enabled(tokens, scheme)


@pytest.mark.parametrize("value,want", [("1", True), ("0", False), ("", None), (None, None), (" On ", True),
                                        ("false", False)])
def test_the_environment_sets_a_switch_or_leaves_it_to_the_device(value, want, monkeypatch):
    if value is None:
        monkeypatch.delenv("HT_TEST_SWITCH", raising=False)
    else:
        monkeypatch.setenv("HT_TEST_SWITCH", value)
    assert switches.from_env("HT_TEST_SWITCH") is want


def test_a_bad_environment_value_is_named(monkeypatch):
    monkeypatch.setenv("HT_TEST_SWITCH", "maybe")
    with pytest.raises(ValueError, match="HT_TEST_SWITCH='maybe'.*1 \\(on\\), 0 \\(off\\)"):
        switches.from_env("HT_TEST_SWITCH")


@pytest.fixture
def posed_table(tmp_path, monkeypatch):
    """A device "posed_gpu" whose table turns the MoE pipeline (up to 8 tokens) and the native op (up to 1) on for
    w4a16 and mxfp4, and says compile_triton off."""
    on = {"on": True, "schemes": ["mxfp4", "w4a16"], "evidence": "test"}
    table = {"device": "posed", "dispatch": {}, "switches": {
        "moe_pipeline": {**on, "max_tokens": 8}, "native_op": {**on, "max_tokens": 1},
        "compile_triton": {"on": False, "max_tokens": 0, "schemes": [], "evidence": "test"}}}
    (tmp_path / "posed_gpu.json").write_text(json.dumps(table))
    monkeypatch.setattr(dispatch, "CONFIG_DIR", tmp_path)
    for module in SWITCHES.values():
        monkeypatch.setattr(module, "ON", None)
    dispatch.clear_caches()
    facts = capability.DeviceFacts((9, 0), 132, 227 * 1024, "posed GPU", "posed_gpu")
    with capability.pose_as(facts):
        yield
    dispatch.clear_caches()


def test_an_unset_switch_follows_the_devices_table(posed_table):
    built = native_op.unavailable() is None
    assert native_op.enabled(1, "w4a16") == built  # on where its C++ kernel builds ...
    assert not native_op.enabled(2, "w4a16") and not native_op.enabled(0, "w4a16")  # ... for 1 token only
    assert moe.enabled(1, "mxfp4") and moe.enabled(8, "w4a16") and not moe.enabled(9, "w4a16")
    assert not moe.enabled(0, "w4a16")  # an empty call: nothing was timed there
    assert not moe.enabled(1, "w8a16") and not native_op.enabled(1, "w8a8-fp8")  # schemes the A/B did not run
    assert not compiled.enabled(1, "w4a16")
    moe.set_enabled(False)  # an explicit setting wins over the table ...
    assert not moe.enabled(1, "w4a16")
    moe.set_enabled(True)
    assert moe.enabled(9, "w8a16") and moe.enabled(0, "w4a16")  # (forced: any size, any scheme)
    moe.set_enabled(None)  # ... and None hands the choice back to it
    assert moe.enabled(1, "w4a16") and not moe.enabled(9, "w4a16")


@pytest.mark.parametrize("entry", [{"on": True, "schemes": ["w4a16"]}, {"on": True, "max_tokens": 8},
                                   {"on": "yes", "schemes": ["w4a16"], "max_tokens": 8}])
def test_an_entry_without_its_scope_turns_nothing_on(entry, posed_table, tmp_path):
    table = json.loads((tmp_path / "posed_gpu.json").read_text())
    table["switches"]["moe_pipeline"] = entry
    (tmp_path / "posed_gpu.json").write_text(json.dumps(table))
    dispatch.clear_caches()
    assert not moe.enabled(1, "w4a16")


def test_the_modules_pass_their_token_count_and_scheme(posed_table):
    """QuantLinear asks with its rows (all leading dims) and scheme, QuantMoE with its routed tokens: a table
    verdict for 1 token of w4a16 takes a [1, 1, K] call onto the native op, not a [1, 2, K] one or another scheme."""
    if native_op.unavailable() is not None:
        pytest.skip(native_op.unavailable())
    calls = []
    orig = native_op.enabled

    def spy(tokens, scheme):
        calls.append((tokens, scheme))
        return orig(tokens, scheme)
    for scheme in ("w4a16", "w8a16"):
        mod = QuantLinear(ht.quantize_weight(torch.randn(24, 256), scheme))
        with torch.no_grad():
            for shape in ((1, 1, 256), (1, 2, 256)):
                before = native_op.stats()
                native_op.enabled = spy
                try:
                    mod(torch.randn(*shape))
                finally:
                    native_op.enabled = orig
                took = sum(native_op.stats()) - sum(before) > 0
                assert took == (shape[1] == 1 and scheme == "w4a16"), (scheme, shape)
    assert calls == [(1, "w4a16"), (2, "w4a16"), (1, "w8a16"), (2, "w8a16")]


def test_a_device_without_a_table_entry_keeps_every_switch_off(monkeypatch):
    for module in SWITCHES.values():
        monkeypatch.setattr(module, "ON", None)
    for sm in ((8, 0), (10, 0), (12, 0)):  # posed devices without a table
        with capability.pose_as(capability.facts_for_sm(sm)):
            assert not switches.measured_switches(capability.device_facts().slug)
            assert not any(_on(m) for m in SWITCHES.values())
    if not torch.cuda.is_available():
        assert not any(_on(m) for m in SWITCHES.values())  # the CPU: no device, no table


def test_a_compiled_module_follows_the_devices_table_and_then_the_switch(posed_table):
    """With the switch unset, a compiled QuantLinear's graph takes the path the device's table turns on (folded
    at trace time); setting the switch (a guarded global) retraces."""
    if native_op.unavailable() is not None:
        pytest.skip(native_op.unavailable())
    qw = ht.quantize_weight(torch.randn(24, 256), "w4a16")
    mod, x = QuantLinear(qw), torch.randn(1, 256)  # 1 token: inside the posed verdict
    graphs = []

    def capture(gm, example_inputs):
        graphs.append({str(n.target) for n in gm.graph.nodes if str(n.target).startswith("humming_triton.")})
        return gm
    torch._dynamo.reset()
    with torch.no_grad():
        fn = torch.compile(copy.deepcopy(mod), fullgraph=True, backend=capture)
        fn(x)
        native_op.set_enabled(False)
        fn(x)
    torch._dynamo.reset()
    assert graphs == [{"humming_triton.quant_linear_native"}, {"humming_triton.quant_linear_nograd"}], graphs


@pytest.mark.parametrize("table", sorted(TABLES.glob("*.json")), ids=lambda p: p.stem)
def test_committed_switch_entries_say_what_was_measured(table):
    """Each entry of a committed table's ``switches`` names a known path, says on or off, and carries its evidence
    (the same-run A/B on that device: numbers and the commit they were measured at)."""
    data = json.loads(table.read_text())
    for name, entry in data.get("switches", {}).items():
        assert name in SWITCHES, f"{table.name}: unknown switch {name!r}"
        assert isinstance(entry.get("on"), bool), f"{table.name}: {name} has no on / off"
        assert len(entry.get("evidence", "")) > 40 and entry.get("commit"), f"{table.name}: {name} has no evidence"


def _record(model, scheme, **times_ms):
    return {"model": model, "scheme": scheme, **{k + "_s": v / 1e3 for k, v in times_ms.items()}}


def test_switch_verdicts_need_a_gain_and_no_loss():
    from benchmarks.switch_verdicts import verdicts
    run = {"device": "GPU", "records": [
        _record("llama", "bf16", eager=4.6, compile=2.3),  # no variant: no comparison
        _record("llama", "w4a16", eager=4.8, eager_native=4.5, compile=3.1, compile_native=2.2, compile_triton=2.9),
        _record("qwen3_moe", "w4a16", eager=6.7, eager_pipeline=6.8, graph=0.90, graph_pipeline=0.76)]}
    v = verdicts([run])
    assert v["native_op"]["on"] and len(v["native_op"]["rows"]) == 2
    assert not v["moe_pipeline"]["on"]  # 1.18x graphed, but eager 1.5 % slower: past the 1 % loss allowed
    assert v["moe_pipeline"]["worst"] == pytest.approx(6.7 / 6.8)
    assert not v["compile_triton"]["on"]  # faster than the default compile, slower than the native op
    assert "compile_triton" not in verdicts([{"records": [_record("llama", "w4a16", eager=1.0, compile=1.0)]}])


def test_switch_verdicts_write_only_their_own_device_table(tmp_path):
    from benchmarks.switch_verdicts import main
    run = tmp_path / "e2e.json"
    run.write_text(json.dumps({"device": "GPU A", "records": [
        _record("llama", "w4a16", eager=4.8, eager_native=4.4, compile=3.1, compile_native=2.2)]}))
    table = tmp_path / "gpu_a.json"
    table.write_text(json.dumps({"device": "GPU A", "dispatch": {"k": 1},
                                 "switches": {"moe_pipeline": {"on": True, "commit": "x", "evidence": "kept"}}}))
    assert main([str(run), "--commit", "abc1234", "--write", str(table)]) == 0
    data = json.loads(table.read_text())
    assert data["dispatch"] == {"k": 1} and data["switches"]["moe_pipeline"]["evidence"] == "kept"
    assert data["switches"]["native_op"]["on"] and "abc1234" in data["switches"]["native_op"]["evidence"]
    assert data["switches"]["native_op"]["max_tokens"] == 1 and data["switches"]["native_op"]["schemes"] == ["w4a16"]
    other = tmp_path / "gpu_b.json"
    other.write_text(json.dumps({"device": "GPU B"}))
    assert main([str(run), "--commit", "abc1234", "--write", str(other)]) == 2  # another device's table
    assert "switches" not in json.loads(other.read_text())


@pytest.mark.parametrize("table", sorted(TABLES.glob("*.json")), ids=lambda p: p.stem)
def test_committed_switch_verdicts_follow_from_their_evidence(table):
    """Each committed verdict is what benchmarks.switch_verdicts derives from the e2e results its evidence names."""
    from benchmarks.switch_verdicts import verdicts
    repo = TABLES.parent
    for name, entry in json.loads(table.read_text()).get("switches", {}).items():
        files = re.findall(r"benchmarks/results/\S+?\.json", entry["evidence"])
        assert files, f"{table.name}: {name}'s evidence names no committed e2e results"
        results = [json.loads((repo / f).read_text()) for f in files]
        v = verdicts(results)[name]
        assert (v["on"], v["max_tokens"], v["schemes"]) == (entry["on"], entry["max_tokens"], entry["schemes"]), \
            f"{table.name}: {name}"


def test_a_native_op_switched_on_but_not_built_says_so_once(monkeypatch):
    monkeypatch.setattr(native_op, "_load", lambda: "the native op's C++ kernel did not build (no compiler)")
    monkeypatch.setattr(native_op, "_WARNED", [])
    monkeypatch.setattr(native_op, "ON", True)
    with pytest.warns(RuntimeWarning, match="did not build \\(no compiler\\); the Python host path runs instead"):
        assert not native_op.enabled(1, "w4a16")
    import warnings
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert not native_op.enabled(1, "w4a16")  # once


def test_a_switch_is_on_up_to_the_largest_batch_it_still_wins_at():
    from benchmarks.switch_verdicts import verdicts
    rec = lambda batch, native: {**_record("llama", "w4a16", compile=3.0, compile_native=native), "batch": batch}  # noqa: E731
    v = verdicts([{"records": [rec(1, 2.2), rec(8, 2.5), rec(32, 3.1)]}])["native_op"]
    assert v["on"] and v["max_tokens"] == 8  # batch 32 is 3 % slower: the scope ends before it
    assert v["gain"] == pytest.approx((3.0 / 2.2 * 3.0 / 2.5) ** 0.5)
    v = verdicts([{"records": [rec(1, 3.05), rec(8, 2.0)]}])["native_op"]
    assert not v["on"] and v["max_tokens"] == 0  # losing at the smallest batch: off, whatever larger ones say


def test_doctor_says_where_each_switch_stands(monkeypatch):
    from humming_triton import doctor
    for module in SWITCHES.values():
        monkeypatch.setattr(module, "ON", None)
    facts = capability.DeviceFacts((9, 0), 132, 227 * 1024, "NVIDIA H100 80GB HBM3", "h100_80gb_hbm3")
    with capability.pose_as(facts):
        text = doctor.report()
    assert re.search(r"native_op +on for mxfp4, w4a16 up to 1 token\(s\) per call: this device's table \(commit \w+\)",
                     text), text
    assert re.search(r"compile_triton +off: this device's table \(commit \w+\) measured it slower", text), text
    monkeypatch.setattr(moe, "ON", False)
    with capability.pose_as((8, 0)):  # a device without a table
        text = doctor.report()
    assert re.search(r"moe_pipeline +off: set \(HUMMING_TRITON_MOE_PIPELINE or set_enabled\)", text), text
    assert re.search(r"native_op +off: this device's table has no verdict", text), text


def test_a_failed_or_wrong_variant_is_a_lost_comparison():
    from benchmarks.switch_verdicts import verdicts
    good = _record("llama", "w4a16", eager=4.8, eager_native=4.4)
    raised = {**_record("llama", "mxfp4", eager=4.8), "native_error": "RuntimeError: boom"}
    wrong = {**_record("llama", "mxfp4", eager=4.8, eager_native=4.0), "native_rel_diff_vs_eager": 0.5}
    assert verdicts([{"records": [good]}])["native_op"]["on"]
    for bad in (raised, wrong):
        v = verdicts([{"records": [good, bad]}])["native_op"]
        assert not v["on"] and v["worst"] == 0.0
    assert len(verdicts([{"records": [good, good]}])["native_op"]["rows"]) == 1  # a repeated record counts once


def test_a_batch_that_lacks_a_model_ends_the_scope():
    from benchmarks.switch_verdicts import verdicts
    rec = lambda model, batch: {**_record(model, "w4a16", compile=3.0, compile_native=2.5), "batch": batch}  # noqa: E731
    v = verdicts([{"records": [rec("llama", 1), rec("qwen3_moe", 1), rec("llama", 8)]}])["native_op"]
    assert v["on"] and v["max_tokens"] == 1  # batch 8 ran the dense model only: not a verdict for the MoE
    v = verdicts([{"records": [rec("llama", 1), rec("qwen3_moe", 1), rec("llama", 8), rec("qwen3_moe", 8)]}])
    assert v["native_op"]["max_tokens"] == 8
