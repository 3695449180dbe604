"""`asmgemm patch` and `asmgemm sass --diff` from the command line, and the rules file's errors
(file:line:col with a caret, never a traceback). The cubin is sgemm_naive, built by the pipeline."""
from __future__ import annotations

import json

import pytest

from asmgemm.errors import AsmError
from asmgemm.pipeline import BuildOptions, assemble, build_file
from asmgemm.sass.patch_rules import parse_rules
from asmgemm.toolchain import find_tool

TOOLS = pytest.mark.skipif(find_tool("ptxas", required=False) is None or find_tool("nvdisasm", required=False) is None,
                           reason="needs ptxas and nvdisasm (pip install 'asmgemm[cuda-tools]')")

GOOD_RULES = """kernel = "sgemm_naive"

[[rule]]
opcode = "FFMA"
loop = 0
stall = 6
"""


@pytest.fixture(scope="module")
def naive_cubin(tmp_path_factory):
    path = tmp_path_factory.mktemp("cubin") / "sgemm_naive.cubin"
    path.write_bytes(assemble(build_file("sgemm_naive", BuildOptions(target="sm_90"))).cubin)
    return path


def write(tmp_path, name, text):
    path = tmp_path / name
    path.write_text(text)
    return path


# ---- the rules file --------------------------------------------------------------------------

def test_rules_parse_regions_and_fields():
    rules = parse_rules('kernel = "k"\n[[rule]]\nopcode = "LDS\\\\..*"\naddresses = [0x40, 0x80]\n'
                        'stall = 3\nyield = true\nwrite_barrier = "none"\nread_barrier = 2\nwait = [0, 5]\n'
                        'reuse = ["A", "C"]\n[[rule]]\nkernel = "j"\nopcode = "FFMA"\nlabels = [".L_x_1", ".L_x_2"]\n'
                        'stall = 1\n')
    first, second = rules.rules
    assert first.kernel == "k" and first.region_kind == "addresses" and first.region == (0x40, 0x80)
    assert first.fields == {"stall": 3, "yield": 0, "write_barrier": 7, "read_barrier": 2,
                            "wait_mask": 0b100001, "reuse": 0b101}
    assert first.opcode.fullmatch("LDS.U.128") and not first.opcode.fullmatch("LDSM")
    assert second.kernel == "j" and second.region == (".L_x_1", ".L_x_2")


@pytest.mark.parametrize("text, where, message", [
    ('[[rule]]\nopcode = "FFMA"\nstall = 16\n', ":3:9:", "stall must be an integer 0-15"),
    ('[[rule]]\nopcode = "FFMA"\nstal = 1\n', ":3:8:", "unknown key 'stal'"),
    ('[[rule]]\nopcode = "FFMA"\nwait = [6]\n', ":3:8:", "wait must be a list of scoreboards 0-5"),
    ('[[rule]]\nopcode = "FFMA"\nreuse = ["E"]\n', ":3:9:", "reuse must be a list of slots"),
    ('[[rule]]\nopcode = "FFMA("\nstall = 1\n', ":2:10:", "opcode is not a regular expression"),
    ('[[rule]]\nopcode = "FFMA"\nloop = 0\naddresses = [0, 16]\nstall = 1\n', ":4:13:", "give one region"),
    ('[[rule]]\nopcode = "FFMA"\n', ":1:1:", "sets no control field"),
    ('[[rule]]\nopcode = "FFMA"\nstall = \n', ":3:9:", "not a valid TOML rules file"),
    ('kernal = "x"\n[[rule]]\nopcode = "FFMA"\nstall = 1\n', ":1:10:", "unknown top-level key 'kernal'"),
    ('[[rule]]\nopcode = "FFMA"\nstall = 1\n[[rule]]\nyield = true\n', ":4:1:", "rule 2: needs opcode"),
])
def test_rules_errors_point_at_the_file(text, where, message):
    with pytest.raises(AsmError) as info:
        parse_rules(text, "r.toml")
    shown = info.value.format()
    assert message in shown
    assert f"r.toml{where}" in shown, shown
    assert "^" in shown and "Traceback" not in shown


# ---- asmgemm patch ---------------------------------------------------------------------------

@pytest.mark.toolchain
@TOOLS
def test_patch_writes_a_checked_cubin_and_diff_shows_the_fields(naive_cubin, tmp_path, run_cli):
    rules = write(tmp_path, "ok.toml", GOOD_RULES)
    out = tmp_path / "patched.cubin"
    code, stdout, err = run_cli("patch", naive_cubin, rules, "-o", out)
    assert code == 0, err
    assert "check passed" in stdout and out.is_file()
    assert out.stat().st_mode & 0o044, "the patched cubin must not be left private (mkstemp's 0600)"
    assert len(out.read_bytes()) == len(naive_cubin.read_bytes())
    code, stdout, err = run_cli("sass", "--diff", naive_cubin, out)
    assert code == 0, err
    assert "FFMA" in stdout and "-> 6" in stdout and ":S06]" in stdout
    assert "0 outside the control fields; 0 other section(s) differ" in stdout
    code, stdout, err = run_cli("sass", "--diff", naive_cubin, out, "--json")
    data = json.loads(stdout)
    assert not data["identical"] and not data["sections"]
    assert all(w["control_only"] and set(w["fields"]) <= {"stall"} for w in data["instructions"])
    assert all(w["fields"]["stall"]["after"] == 6 for w in data["instructions"])
    code, stdout, err = run_cli("sass", "--diff", naive_cubin, naive_cubin)
    assert code == 0 and "identical" in stdout


@pytest.mark.toolchain
@TOOLS
def test_patch_json_lists_changes(naive_cubin, tmp_path, run_cli):
    rules = write(tmp_path, "ok.toml", GOOD_RULES)
    out = tmp_path / "patched.cubin"
    code, stdout, err = run_cli("patch", naive_cubin, rules, "-o", out, "--json")
    assert code == 0, err
    data = json.loads(stdout)
    assert data["accepted"] and data["output"] == str(out) and data["changed"] == len(data["changes"]) > 0
    assert all(c["fields"]["stall"]["after"] == 6 for c in data["changes"])


@pytest.mark.toolchain
@TOOLS
def test_a_refused_patch_writes_nothing(naive_cubin, tmp_path, run_cli):
    rules = write(tmp_path, "bad.toml", 'kernel = "sgemm_naive"\n[[rule]]\nopcode = ".*"\nstall = 1\n')
    out = tmp_path / "patched.cubin"
    code, stdout, err = run_cli("patch", naive_cubin, rules, "-o", out)
    assert code == 1
    assert "patch refused" in err and "nothing written" in err and "latency" in err
    assert "Traceback" not in err and not out.exists()
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")]
    # an existing output file is left as it was
    out.write_bytes(b"keep")
    code, stdout, err = run_cli("patch", naive_cubin, rules, "-o", out, "--json")
    assert code == 1 and out.read_bytes() == b"keep"
    data = json.loads(stdout)
    assert not data["accepted"] and data["output"] is None
    hazards = data["checks"]["sgemm_naive"]["hazards"]
    assert hazards and all({"address", "instruction", "hazard", "message"} <= set(h) for h in hazards)


@pytest.mark.toolchain
@TOOLS
@pytest.mark.parametrize("rules_text, message", [
    ('[[rule]]\nopcode = "NOTANOP"\nstall = 4\n', "selects no instruction"),
    ('[[rule]]\nopcode = "FFMA"\nloop = 7\nstall = 4\n', "there is no loop 7"),
    ('[[rule]]\nkernel = "nope"\nopcode = "FFMA"\nstall = 4\n', "no kernel named 'nope'"),
    ('[[rule]]\nopcode = "FFMA"\naddresses = [0x8, 0x20]\nstall = 4\n', "multiples of 0x10"),
    ('[[rule]]\nopcode = "FFMA"\nlabels = [".L_x_0", ".L_nope"]\nstall = 4\n', "no label '.L_nope'"),
])
def test_rules_that_do_not_fit_the_cubin_are_errors(naive_cubin, tmp_path, run_cli, rules_text, message):
    rules = write(tmp_path, "r.toml", rules_text)
    code, stdout, err = run_cli("patch", naive_cubin, rules, "-o", tmp_path / "o.cubin")
    assert code == 1 and message in err and "r.toml:" in err, err
    assert "Traceback" not in err and not (tmp_path / "o.cubin").exists()


@pytest.mark.toolchain
@TOOLS
def test_command_line_mistakes(naive_cubin, tmp_path, run_cli):
    rules = write(tmp_path, "ok.toml", GOOD_RULES)
    code, _, err = run_cli("patch", naive_cubin, rules, "-o", naive_cubin)
    assert code == 1 and "names the input cubin" in err
    code, _, err = run_cli("patch", tmp_path / "missing.cubin", rules, "-o", tmp_path / "o.cubin")
    assert code == 1 and "no such file" in err
    code, _, err = run_cli("sass", "--diff", naive_cubin)
    assert code == 1 and "give A.cubin B.cubin" in err
    code, _, err = run_cli("sass", naive_cubin, naive_cubin)
    assert code == 1 and "use --diff" in err
    code, _, err = run_cli("sass", "--diff", naive_cubin, rules)
    assert code == 1 and "not one" in err


@pytest.mark.toolchain
@TOOLS
def test_reuse_pass_from_the_command_line(naive_cubin, tmp_path, run_cli):
    out = tmp_path / "reuse.cubin"
    code, stdout, err = run_cli("patch", naive_cubin, "--reuse-pass", "-o", out)
    assert code == 0, err
    assert "reuse pass, sgemm_naive:" in stdout and "not measured on a GPU" in stdout and out.is_file()
    code, stdout, err = run_cli("patch", naive_cubin, "--reuse-pass", "-o", out, "--json")
    assert json.loads(stdout)["reuse_pass"][0]["measured"] is False
    code, _, err = run_cli("patch", naive_cubin, "-o", out)
    assert code == 1 and "nothing to do" in err
