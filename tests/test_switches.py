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


def _on(module, tokens: int = 1) -> bool:
    return module.enabled() if module is compiled else module.enabled(tokens)


@pytest.mark.parametrize("value,want", [("1", True), ("0", False), ("", None), (None, None)])
def test_the_environment_sets_a_switch_or_leaves_it_to_the_device(value, want, monkeypatch):
    if value is None:
        monkeypatch.delenv("HT_TEST_SWITCH", raising=False)
    else:
        monkeypatch.setenv("HT_TEST_SWITCH", value)
    assert switches.from_env("HT_TEST_SWITCH") is want


def test_a_bad_environment_value_is_named(monkeypatch):
    monkeypatch.setenv("HT_TEST_SWITCH", "yes")
    with pytest.raises(ValueError, match="HT_TEST_SWITCH='yes'.*1 \\(on\\), 0 \\(off\\)"):
        switches.from_env("HT_TEST_SWITCH")


@pytest.fixture
def posed_table(tmp_path, monkeypatch):
    """A device "posed_gpu" whose table turns the MoE pipeline and the native op on, and says compile_triton off."""
    table = {"device": "posed", "dispatch": {}, "switches": {
        "moe_pipeline": {"on": True, "evidence": "test"}, "native_op": {"on": True, "evidence": "test"},
        "compile_triton": {"on": False, "evidence": "test"}}}
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
    assert moe.enabled(1) and moe.enabled(4096) and compiled.enabled() is False  # no max_tokens: unbounded
    assert native_op.enabled(1) == (native_op.unavailable() is None)  # on, where its C++ kernel builds
    moe.set_enabled(False)  # an explicit setting wins over the table ...
    assert not moe.enabled(1)
    moe.set_enabled(None)  # ... and None hands the choice back to it
    assert moe.enabled(1)


def test_a_table_verdict_holds_up_to_the_tokens_it_was_timed_at(posed_table, tmp_path):
    table = json.loads((tmp_path / "posed_gpu.json").read_text())
    table["switches"]["moe_pipeline"]["max_tokens"] = 8
    (tmp_path / "posed_gpu.json").write_text(json.dumps(table))
    dispatch.clear_caches()
    assert moe.enabled(1) and moe.enabled(8) and not moe.enabled(9)
    moe.set_enabled(True)  # forced on: every size
    assert moe.enabled(9)


def test_a_device_without_a_table_entry_keeps_every_switch_off(monkeypatch):
    for module in SWITCHES.values():
        monkeypatch.setattr(module, "ON", None)
    for sm in ((9, 0), (8, 0), (10, 0)):  # posed devices of the committed tables (or none)
        with capability.pose_as(capability.facts_for_sm(sm)):
            slug = capability.device_facts().slug
            for name, module in SWITCHES.items():
                entry = switches.measured_switches(slug).get(name)
                assert _on(module) is bool(entry and entry["on"] and
                                           (module is not native_op or native_op.unavailable() is None))
    assert not any(_on(m) for m in SWITCHES.values())  # the CPU: no device, no table


def test_a_compiled_module_follows_the_devices_table_and_then_the_switch(posed_table):
    """With the switch unset, a compiled QuantLinear's graph takes the path the device's table turns on (folded
    at trace time); setting the switch (a guarded global) retraces."""
    if native_op.unavailable() is not None:
        pytest.skip(native_op.unavailable())
    qw = ht.quantize_weight(torch.randn(24, 256), "w4a16")
    mod, x = QuantLinear(qw), torch.randn(3, 256)
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
    assert data["switches"]["native_op"]["max_tokens"] == 1  # the records' batch
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
        assert verdicts(results)[name]["on"] is entry["on"], f"{table.name}: {name}"


def test_a_native_op_switched_on_but_not_built_says_so_once(monkeypatch):
    monkeypatch.setattr(native_op, "_load", lambda: "the native op's C++ kernel did not build (no compiler)")
    monkeypatch.setattr(native_op, "_WARNED", [])
    monkeypatch.setattr(native_op, "ON", True)
    with pytest.warns(RuntimeWarning, match="did not build \\(no compiler\\); the Python host path runs instead"):
        assert not native_op.enabled(1)
    import warnings
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert not native_op.enabled(1)  # once


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
    assert re.search(r"native_op +on up to \d+ token\(s\) per call: this device's table \(commit \w+\)", text), text
    assert re.search(r"compile_triton +off: this device's table \(commit \w+\) measured it slower", text), text
    monkeypatch.setattr(moe, "ON", False)
    with capability.pose_as((8, 0)):  # a device without a table
        text = doctor.report()
    assert re.search(r"moe_pipeline +off: set \(HUMMING_TRITON_MOE_PIPELINE or set_enabled\)", text), text
    assert re.search(r"native_op +off: this device's table has no verdict", text), text
