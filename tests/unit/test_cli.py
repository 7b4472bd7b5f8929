"""The `eyas` command: subcommands listed, --help on each, key=value for every tool, the
checkout's entry points behind it (tests/integration/test_install.py runs the installed one)."""
import os
import sys

import pytest

from eyas import cli

COMMANDS = ("run", "doctor", "export", "compare", "replay", "bench")


@pytest.fixture(autouse=True)
def _restored(monkeypatch):
    """The command puts the checkout on PYTHONPATH and names itself in each entry module."""
    from workflows import compare, doctor, export, pipeline, replay

    monkeypatch.setenv("PYTHONPATH", os.environ.get("PYTHONPATH", ""))
    monkeypatch.setattr(sys, "path", list(sys.path))
    monkeypatch.setattr(sys, "argv", list(sys.argv))
    for module in (pipeline, doctor, export, replay, compare):
        monkeypatch.setattr(module, "PROG", module.PROG)


def test_help_lists_every_subcommand(capsys):
    assert cli.main(["--help"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("usage: eyas COMMAND")
    assert [line.split()[0] for line in out.split("commands:\n")[1].split("\n\n")[0]
            .splitlines()] == list(COMMANDS)
    assert cli.main([]) == 2 and "usage: eyas" in capsys.readouterr().out
    assert cli.main(["trian"]) == 2
    assert "no command 'trian'" in capsys.readouterr().err


def test_each_subcommand_has_help_under_its_own_name(capsys):
    assert cli.main(["run", "--help"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("usage: eyas run [GROUP=CHOICE ...] [key=value ...]")
    assert "experiment= chat, deep, published-recipe, tiny" in out and "docs/configuration.md" in out
    for command in ("doctor", "export"):
        with pytest.raises(SystemExit) as stop:  # argparse's --help
            cli.main([command, "--help"])
        assert stop.value.code == 0
        out = capsys.readouterr().out
        assert f"usage: eyas {command} " in out and "key=value" in out
    assert cli.main(["replay", "--help"]) == 0
    assert capsys.readouterr().out.startswith("usage: eyas replay RUN_DIR")


def test_bench_lists_the_scripts_and_shows_their_docs(capsys):
    scripts = cli.benches()
    # peer_recipe.py and record.py are modules the benchmarks import, not benchmarks
    assert {"extract", "train", "serve", "recipe", "online", "cpu-size",
            "doctor-verdicts", "skew-cost", "family", "vocab", "k", "validate", "peer-speed",
            "damage", "fp8", "limits", "dtype", "size", "first-command", "scale",
            "prepare-ray-data", "regenerate-ray-data", "store-read", "peer-dflash",
            "peer-peagle", "threads"} == set(scripts)
    assert cli.main(["bench", "--help"]) == 0
    listed = capsys.readouterr().out
    assert all(f"  {name} " in listed for name in scripts)
    assert cli.main(["bench", "serve_bench", "--help"]) == 0  # the file's name works too
    assert "python bench/serve_bench.py RUN_DIR" in capsys.readouterr().out
    assert cli.main(["bench", "nope"]) == 2
    assert "no benchmark 'nope'; there are: cpu-size" in capsys.readouterr().err


@pytest.mark.parametrize("name", sorted(cli.benches()))
def test_every_bench_script_answers_help_when_run_directly(name):
    """`python bench/X.py --help` prints the script's usage and exits 0, before it reads any
    run directory (it must not take --help for one)."""
    import subprocess

    path = cli.benches()[name]
    done = subprocess.run([sys.executable, str(path), "--help"], capture_output=True,
                          text=True, timeout=120, cwd=path.parent.parent)
    assert done.returncode == 0, done.stderr[-2000:]
    first = cli._bench_help(path).splitlines()[0]
    assert first.split()[0] in done.stdout, done.stdout[:500]


@pytest.mark.parametrize("args,positional,flags", [
    (["draft=d", "data=x/extract", "--engine", "vllm"], (),
     ["--draft=d", "--data=x/extract", "--engine", "vllm"]),
    (["write_fixed=out", "reported-accuracy=0.6,0.5", "debug=true"], (),
     ["--write-fixed=out", "--reported-accuracy=0.6,0.5", "--debug"]),
    (["debug=false", "k=3"], (), ["--k=3"]),
    (["tracking_uri=sqlite:///a=b.db", "run_dir=r", "--debug"], ("run_dir", "tracking_uri"),
     ["r", "sqlite:///a=b.db", "--debug"]),
    (["runs/demo", "http://host/?a=b"], ("run_dir",), ["runs/demo", "http://host/?a=b"]),
])
def test_key_value_is_the_tools_flags(args, positional, flags):
    assert cli.as_flags(args, positional) == flags


def test_the_tools_take_key_value(tmp_path, capsys):
    missing = tmp_path / "nope"
    assert cli.main(["doctor", f"draft={tmp_path}", f"data={missing}"]) == 2
    assert f"--data {missing}: no such file or directory" in capsys.readouterr().err
    assert cli.main(["replay", f"run_dir={tmp_path}"]) == 2
    assert "mlflow_unlogged.jsonl: nothing" in capsys.readouterr().err
    assert cli.main(["run", "trian.lr=1"]) == 2
    assert "unknown config key 'trian'; did you mean 'train'?" in capsys.readouterr().err
    assert cli.main(["run", f"run_dir={tmp_path / 'run'}", "extract.layout.draft_inputs=null",
                     "extract.layout.spread=2"]) == 2
    assert "2 slots spread from block 1 to block 1" in " ".join(capsys.readouterr().err.split())
    assert not (tmp_path / "run").exists()  # refused before any stage


def test_a_switch_is_written_true_or_false():
    from eyas.cli import as_flags

    assert as_flags(["static=true", "debug=false", "device=cuda"]) == ["--static",
                                                                       "--device=cuda"]
