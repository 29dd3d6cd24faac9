"""TENET dataflow model (seed 003): the worked example, and every metric against brute force."""

import json
import os
import re
import subprocess
import sys
import types
from pathlib import Path

import pytest
from helpers import brute_force

from tvm_dsa.cli import main
from tvm_dsa.dataflow import (Dataflow, Interconnect, NotationError, PEArray, TensorOp, analyse,
                              mesh, multicast, systolic_1d, systolic_2d)
from tvm_dsa.dataflow import relations as rel
from tvm_dsa.dataflow.explore import best_relation
from tvm_dsa.dataflow.library import BENCHMARKS, standard_dataflows
from tvm_dsa.hardware import get

GEMM = "Y[i,j] += A[i,k] * B[k,j]"


# -- every metric against brute force (helpers.brute_force) --------------------------------------

def assert_matches_brute_force(df, array):
    m = analyse(df, array)
    instances, active, times, volumes = brute_force(df, array)
    assert active == instances                        # one instance per PE per stamp
    assert (m.instances, m.time_stamps) == (instances, times)
    assert {t.tensor: t for t in m.tensors} == volumes
    return m


# -- the seed's worked example ---------------------------------------------------------------

def seed_example(window=True):
    """2x2 GEMM with K = 4 on a 2x2 systolic array, Θ = { S[i,j,k] -> (PE[i,j] | T[i+j+k]) }; the
    seed's table shows the stamps t = 0..3."""
    op = TensorOp.parse("GEMM", GEMM, {"i": 2, "j": 2, "k": 4}, where="i + j + k <= 3" if window else "")
    return Dataflow.parse(op, "{ S[i,j,k] -> (PE[i,j] | T[i+j+k]) }"), PEArray((2, 2), systolic_2d(), bandwidth=2)


def test_seed_worked_example_tensor_a():
    df, array = seed_example()
    a = analyse(df, array).tensor("A")
    assert (a.total, a.reuse, a.unique) == (12, 5, 7)
    assert f"{a.reuse_factor:.3f}" == "1.714"
    assert (a.spatial_reuse, a.temporal_reuse) == (5, 0)      # A flows PE[i,j] -> PE[i,j+1]


def test_seed_table_is_the_data_assignment():
    df, array = seed_example()
    table = {  # the seed's table: (t, PE) -> A element
        (0, (0, 0)): (0, 0),
        (1, (0, 0)): (0, 1), (1, (0, 1)): (0, 0), (1, (1, 0)): (1, 0),
        (2, (0, 0)): (0, 2), (2, (0, 1)): (0, 1), (2, (1, 0)): (1, 1), (2, (1, 1)): (1, 0),
        (3, (0, 0)): (0, 3), (3, (0, 1)): (0, 2), (3, (1, 0)): (1, 2), (3, (1, 1)): (1, 1),
    }
    pairs = set()
    rel.SpaceTime(df, array).assignment("A").wrap().foreach_point(
        lambda p: pairs.add(tuple(p.get_coordinate_val(rel.isl.dim_type.set, d).to_python() for d in range(5))))
    assert pairs == {(*pe, t, *a) for (t, pe), a in table.items()}


def test_seed_instances_at_t1():
    df, _ = seed_example(window=False)
    at_t1 = rel.theta(df).intersect_range(rel.isl.Set("{ ST[p0, p1, t] : t = 1 }")).domain()
    found = set()
    at_t1.foreach_point(lambda p: found.add(tuple(p.get_coordinate_val(rel.isl.dim_type.set, d).to_python()
                                                  for d in range(3))))
    assert found == {(0, 0, 1), (1, 0, 0), (0, 1, 0)}


def test_latency_and_bandwidths_follow_the_counts():
    df, array = seed_example()
    m = assert_matches_brute_force(df, array)
    y, a, b = (m.tensor(t) for t in "YAB")
    assert m.utilisation == 12 / (4 * 4)                         # 12 active PE-stamps of 4 PEs x 4 stamps
    assert m.compute_delay == pytest.approx(4)                   # sum(D_S) / (util x PEs) = the 4 stamps
    assert m.read_delay == (a.unique + b.unique) / 2 and m.write_delay == y.unique / 2
    assert m.latency == max(m.compute_delay, m.read_delay, m.write_delay) == 7.0
    assert m.ibw("A") == a.spatial_reuse / m.compute_delay and m.sbw() == (y.unique + a.unique + b.unique) / 4
    assert y.temporal_reuse == 8 and y.spatial_reuse == 0        # Y stays in its PE for k = 1..3


def test_full_example_loads_each_element_once():
    df, array = seed_example(window=False)
    m = assert_matches_brute_force(df, array)
    assert [(t.total, t.unique) for t in m.tensors] == [(16, 4), (16, 8), (16, 8)]
    assert m.time_stamps == 6


# -- every benchmark against brute force -------------------------------------------------------

SMALL = {
    "gemm": {"i": 5, "j": 4, "k": 3},
    "conv2d": {"k": 3, "c": 2, "ox": 3, "oy": 4, "rx": 2, "ry": 2},
    "mttkrp": {"i": 3, "j": 4, "k": 3, "l": 2},
    "mmc": {"i": 3, "j": 4, "k": 2, "l": 3},
    "jacobi2d": {"i": 5, "j": 4},
}
SHAPE = (2, 3)
INTERCONNECTS = {"plain": [multicast(2, 2, (0, 1)), mesh()], "systolic": [systolic_2d(), systolic_1d(2, axis=0)]}
CASES = [(name, kind + suffix, ic) for name in SMALL for kind in BENCHMARKS[name].stationary
         for variant, suffix in (("plain", ""), ("systolic", ", systolic")) for ic in INTERCONNECTS[variant]]


@pytest.mark.parametrize("name,kind,interconnect", CASES, ids=[f"{n}-{k}-{i.name}" for n, k, i in CASES])
def test_standard_dataflows_match_brute_force(name, kind, interconnect):
    bench = BENCHMARKS[name]
    df = standard_dataflows(bench, bench.op(SMALL[name]), SHAPE)[kind]
    assert_matches_brute_force(df, PEArray(SHAPE, interconnect, bandwidth=3))


@pytest.mark.parametrize("sizes,text,shape,interconnect", [
    # 1-D arrays: a systolic chain and a multicast bus
    ({"i": 3, "j": 5, "k": 4}, "PE[k % 4] | T[i, j + k]", (4,), systolic_1d()),
    ({"i": 3, "j": 5, "k": 4}, "PE[j % 2] | T[j // 2, i, k]", (2,), multicast(1)),
    ({"i": 3, "j": 5, "k": 4}, "PE[i] | T[k, j]", (3,), multicast(2)),
    # skew in space: a diagonal (affine) mapping the data-centric notation cannot write
    ({"i": 4, "j": 4, "k": 3}, "PE[(i + k) % 2, j % 2] | T[i // 2, j // 2, k, (i + k) // 2]", (2, 2), mesh()),
    # one loop split over both space and time, seed-style fl()
    ({"i": 6, "j": 2, "k": 3}, "PE[i % 3, j] | T[fl(i / 3), k + i % 3]", (3, 2), systolic_2d()),
])
def test_hand_written_gemm_dataflows_match_brute_force(sizes, text, shape, interconnect):
    df = Dataflow.parse(TensorOp.parse("GEMM", GEMM, sizes), text)
    assert_matches_brute_force(df, PEArray(shape, interconnect, bandwidth=1))


# -- errors name the problem -------------------------------------------------------------------

def test_dataflow_outside_the_array_is_named():
    op = TensorOp.parse("GEMM", GEMM, {"i": 3, "j": 2, "k": 2})
    with pytest.raises(NotationError, match=r"PE\[2, .\], outside the \(2, 2\) array"):
        analyse(Dataflow.parse(op, "PE[i, j] | T[k]"), PEArray((2, 2), systolic_2d(), 1))


def test_two_instances_on_one_pe_and_stamp_are_named():
    op = TensorOp.parse("GEMM", GEMM, {"i": 2, "j": 2, "k": 2})
    with pytest.raises(NotationError, match=r"runs S\[\d, \d, \d\] and S\[\d, \d, \d\] on the same PE"):
        analyse(Dataflow.parse(op, "PE[i, j] | T[0]"), PEArray((2, 2), systolic_2d(), 1))


@pytest.mark.parametrize("text,msg", [
    ("PE[i * j, 0] | T[k]", r"i \* j multiplies two non-constant terms"),
    ("PE[i, q] | T[k]", "unknown loop variable 'q'"),
    ("PE[i, j] | T[k / 2]", r"'/' is only allowed inside fl\(\.\.\.\)"),
    ("PE[i % 0, j] | T[k]", "% needs a positive integer constant"),
    ("PE[i, j] T[k]", "expected a dataflow 'PE"),
    ("S[i, k, j] -> PE[i, j] | T[k]", r"names the loops S\[i, k, j\] but GEMM has S\[i, j, k\]"),
])
def test_bad_dataflow_text_is_named(text, msg):
    op = TensorOp.parse("GEMM", GEMM, {"i": 2, "j": 2, "k": 2})
    with pytest.raises(NotationError, match=msg):
        Dataflow.parse(op, text)


def test_bad_ops_and_arrays_are_named():
    with pytest.raises(NotationError, match="extent of loop 'k' must be a positive integer"):
        TensorOp.parse("GEMM", GEMM, {"i": 2, "j": 2, "k": 0})
    with pytest.raises(NotationError, match="mod cannot name a loop"):
        TensorOp.parse("copy", "Y[mod] = A[mod]", {"mod": 2})
    with pytest.raises(NotationError, match="Y is both read and written"):
        TensorOp.parse("acc", "Y[i] = Y[i] + A[i]", {"i": 2})
    with pytest.raises(NotationError, match="interconnect 'systolic-2d' is 2-D but the PE array"):
        PEArray((4,), systolic_2d(), 1)
    with pytest.raises(NotationError, match="same-stamp .* must point to lexicographically larger PEs"):
        Interconnect("bus", ((-1,),), delay=0)
    op = TensorOp.parse("GEMM", GEMM, {"i": 2, "j": 2, "k": 2})
    with pytest.raises(NotationError, match="has 1 space dimension.*PE array \\(2, 2\\) has 2"):
        analyse(Dataflow.parse(op, "PE[i] | T[j, k]"), PEArray((2, 2), systolic_2d(), 1))


# -- tvm-dsa dataflow ------------------------------------------------------------------------

def test_cli_given_dataflow_prints_the_models_metrics(capsys):
    assert main(["dataflow", GEMM, "i=2,j=2,k=4", "--array", "2x2", "--interconnect", "systolic-2d",
                 "--bandwidth", "2", "--dataflow", "PE[i,j] | T[i+j+k]", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert "explored" not in out                      # a given dataflow is evaluated, nothing explored
    [row] = out["dataflows"]
    df, array = seed_example(window=False)
    expected = json.loads(json.dumps(analyse(df, array).to_dict()))
    assert {k: v for k, v in row.items() if k not in ("name", "seconds", "op")} == \
        {k: v for k, v in expected.items() if k != "op"}


def test_cli_prints_the_seed_worked_example(capsys):
    """The seed's table (stamps t <= 3): tensor A's total 12, reuse 5 (all spatial), unique 7, reuse factor 1.714."""
    assert main(["dataflow", GEMM, "i=2,j=2,k=4", "--array", "2x2", "--interconnect", "systolic-2d",
                 "--bandwidth", "2", "--dataflow", "PE[i,j] | T[i+j+k]", "--where", "i + j + k <= 3"]) == 0
    text = capsys.readouterr().out
    assert re.search(r"^ +tensor +total +reuse +spatial +temporal +unique +reuse factor", text, re.M)
    assert re.search(r"^ +A +12 +5 +5 +0 +7 +1\.714 ", text, re.M)


def test_cli_where_needs_a_dataflow(capsys):
    assert main(["dataflow", "gemm", "i=2,j=2,k=4", "--where", "i + j + k <= 3"]) == 2
    assert capsys.readouterr().err == "tvm-dsa: error: --where cuts the loop domain of a given --dataflow only\n"


@pytest.mark.parametrize("islpy,problem", [
    (None, "islpy-barvinok is not installed"),                                     # import islpy fails
    (types.SimpleNamespace(Set=object), "islpy is installed without barvinok (islpy-barvinok)"),
])
def test_cli_without_barvinok_names_the_extra(islpy, problem, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "islpy", islpy)
    assert main(["dataflow", "gemm", "i=4,j=4,k=4"]) == 2
    assert capsys.readouterr().err == (f"tvm-dsa: error: counting a dataflow's metrics needs barvinok, but {problem}: "
                                       'pip install "tvm-dsa[tenet]"\n')


def test_cli_runs_and_explains_itself_without_islpy():
    """A fresh interpreter where islpy cannot be imported at all: the CLI loads, the ranking (stored closed
    forms only) runs, and `tvm-dsa dataflow <op>` exits 2 with the one-line error, no traceback."""
    code = ("import sys; sys.modules['islpy'] = None\n"
            "from tvm_dsa.cli import main\n"
            "assert main(['dataflow', '--model', 'dlrm', '--tiny', '--json']) == 0\n"
            "sys.exit(main(['dataflow', 'gemm']))")
    src = str(Path(__file__).resolve().parent.parent / "src")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [src, os.environ.get("PYTHONPATH")]))}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 2
    assert json.loads(done.stdout)["ranked"]
    assert "Traceback" not in done.stderr                      # the rest is TVM's own warnings compiling dlrm
    assert done.stderr.splitlines()[-1] == ("tvm-dsa: error: counting a dataflow's metrics needs barvinok, but "
                                            'islpy-barvinok is not installed: pip install "tvm-dsa[tenet]"')


def test_cli_standard_dataflows_on_the_mme_and_the_best_found(capsys):
    assert main(["dataflow", "gemm", "i=32,j=32,k=8", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    hw = get("stcp920")
    bench = BENCHMARKS["gemm"]
    op = bench.op({"i": 32, "j": 32, "k": 8})
    bandwidth = hw.lb_bytes_per_cycle / 2
    expected = {name: analyse(df, PEArray((hw.mme.rows, hw.mme.cols),
                                          systolic_2d() if "systolic" in name else multicast(31, 2, (0, 1)),
                                          bandwidth)).latency
                for name, df in standard_dataflows(bench, op, (16, 32)).items()}
    assert [r["name"] for r in out["dataflows"]] == sorted(expected, key=expected.get)
    assert [r["latency"] for r in out["dataflows"]] == sorted(expected.values())
    explored = best_relation(op, PEArray((16, 32), systolic_2d(), bandwidth))
    assert out["explored"]["best"] == json.loads(json.dumps(explored.best.metrics.to_dict()))
    assert out["explored"]["candidates"] == explored.candidates > out["explored"]["evaluated"]


def test_cli_explores_a_statement_and_prints_the_best_found(capsys):
    assert main(["dataflow", "Y[i] += A[i,k] * x[k]", "i=8,k=6", "--array", "2x4", "--interconnect", "mesh"]) == 0
    text = capsys.readouterr().out
    op = TensorOp.parse("op", "Y[i] += A[i,k] * x[k]", {"i": 8, "k": 6})
    explored = best_relation(op, PEArray((2, 4), mesh(), get("stcp920").lb_bytes_per_cycle / 2))
    assert f"best found: {explored.best.metrics.dataflow}\n" in text
    assert f"latency {explored.best.metrics.latency:,.1f}" in text
    assert f"explored {explored.candidates:,} affine dataflows on the 2x4 mesh array" in text


@pytest.mark.parametrize("argv,msg", [
    (["dataflow", "gemm", "i=4,j=4"], "gemm has loops i, j, k; got sizes for i, j"),
    (["dataflow", "gemm", "i=4;j=4,k=2"], "sizes must look like i=64,j=64,k=64"),
    (["dataflow", "gemm", "--interconnect", "torus"], "unknown interconnect 'torus'"),
    (["dataflow", "fft"], "unknown operation 'fft'"),
    (["dataflow", "Y[i] += A[i,k] * x[k]"], "a statement needs its loop sizes"),
    (["dataflow", "gemm", "--array", "4x4", "--interconnect", "mesh", "--dataflow", "PE[i, j] | T[k]"],
     r"places instances on PE\[\d+, \d+\], outside the \(4, 4\) array"),
])
def test_cli_bad_input_exits_2_with_the_problem(argv, msg, capsys):
    assert main(argv) == 2
    assert re.search(msg, capsys.readouterr().err)


def test_cli_help_names_the_options(capsys):
    with pytest.raises(SystemExit) as stop:
        main(["dataflow", "--help"])
    assert stop.value.code == 0
    out = capsys.readouterr().out
    assert "--dataflow" in out and "PE[i % 8, j % 8]" in out and "multicast-K" in out
