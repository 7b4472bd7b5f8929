"""Config composition: every YAML composes, README overrides work, errors name the key."""
import re
import shlex
from pathlib import Path

import pytest

from eyas.config import STAGES, PipelineConfig
from workflows.config import CONF_DIR, GROUPS, ConfigError, flatten, load_config, to_yaml

README = Path(__file__).resolve().parents[2] / "README.md"


def _readme_block(marker: str) -> list[str]:
    text = README.read_text()
    block = re.search(rf"<!-- {marker} -->\s*```bash\n(.*?)```", text, re.S)
    assert block, f"README has no {marker} block"
    return [line.split("#")[0].strip() for line in block.group(1).splitlines() if line.strip()]


@pytest.mark.parametrize("group,choice", [(g, p.stem) for g in GROUPS
                                          for p in sorted((CONF_DIR / g).glob("*.yaml"))])
def test_every_group_file_composes(group, choice, monkeypatch):
    needs = {("target", "local"): ["target.path=/models/x"],
             ("data", "files"): ["data.train_files=[/d.jsonl]"]}
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://127.0.0.1:5000")  # mlflow=server reads it
    cfg = load_config([f"{group}={choice}", *needs.get((group, choice), [])])
    assert isinstance(cfg, PipelineConfig)


@pytest.mark.parametrize("experiment", [p.stem for p in (CONF_DIR / "experiment").glob("*.yaml")])
def test_every_experiment_composes(experiment):
    assert isinstance(load_config([f"experiment={experiment}"]), PipelineConfig)


def test_readme_override_examples_compose():
    lines = _readme_block("override-examples") + _readme_block("pipeline-command")
    commands = [shlex.split(line.split("workflows.pipeline", 1)[1]) for line in lines]
    assert len(commands) >= 7
    for args in commands:
        cfg = load_config(args)
        for arg in args:
            key, _, value = arg.partition("=")
            if "." in key:  # the value landed where the README says
                got = flatten(cfg)[key].replace("'", "").replace(" ", "")
                assert got.lower() == value.lower(), (key, got)


def test_defaults_and_precedence():
    cfg = load_config([])
    assert cfg.stages == list(STAGES) and Path(cfg.run_dir).is_absolute()
    assert cfg.extract.layout.draft_inputs == ["block_out:0", "block_out:1", "block_out:2"]
    tiny = load_config(["experiment=tiny", "extract=default", "target.builtin.hidden_size=96"])
    assert tiny.target.builtin.num_heads == 2  # from the experiment
    assert tiny.target.builtin.hidden_size == 96  # the command line wins
    assert tiny.extract.layout.draft_inputs is None  # the group choice
    assert "target.builtin.hidden_size" in flatten(tiny) and "hidden_size: 96" in to_yaml(tiny)


@pytest.mark.parametrize("override,message", [
    ("trian.lr=1", "unknown config key 'trian'; did you mean 'train'"),
    ("target.builtin.sed=3", "'target.builtin.sed'; did you mean 'target.builtin.seed'"),
    ("train.lr=fast", "bad value for 'train.lr'"),
    ("train.num_workers=1.5", "bad value for 'train.num_workers'"),
    ("stages=[prepare,extrct]", "unknown stage 'extrct'.*did you mean 'extract'"),
    ("target=nope", "no conf/target/nope.yaml; choices for target: builtin, local"),
    ("experiment=nope", "experiments: deep, tiny"),
    ("data.on_bad_record=ignore", "data.on_bad_record='ignore': must be one of error, skip"),
    ("target=local", "target=local needs target.path"),
    ("run_dir", "not of the form key=value"),
])
def test_bad_overrides_name_the_key(override, message):
    with pytest.raises(ConfigError, match=message):
        load_config([override])


def test_bad_yaml_names_the_file(tmp_path):
    conf = tmp_path / "conf"
    for group in GROUPS:
        (conf / group).mkdir(parents=True)
    (conf / "config.yaml").write_text("defaults:\n  train: mine\nstages: [prepare]\n")
    (conf / "train" / "mine.yaml").write_text("ttt_stpes: 3\n")
    with pytest.raises(ConfigError, match=r"mine.yaml: unknown config key 'train.ttt_stpes'; "
                                          r"did you mean 'train.ttt_steps'"):
        load_config([], conf_dir=conf)


@pytest.mark.parametrize("override,message", [
    ("train.batch_size=-3", r"train.batch_size=-3: must be >= 1"),
    ("train.epochs=0", r"train.epochs=0: must be >= 1"),
    ("extract.samples_per_shard=0", r"extract.samples_per_shard=0: must be >= 1"),
    ("serve.num_speculative_tokens=0", r"serve.num_speculative_tokens=0: must be >= 1"),
    ("serve.num_speculative_tokens=100", r"serve.num_speculative_tokens=100 exceeds "
                                         r"train.ttt_steps=7.*<=7"),
    ("eval.steps=5", r"eval.steps=5 differs from serve.num_speculative_tokens=3"),
    ("data.generation.on_truncated=maybe", r"must be one of drop, keep"),
    ("data.generation.max_new_tokens=0", r"data.generation.max_new_tokens=0: must be >= 1"),
    ("train.adam_beta2=1", r"train.adam_beta2=1.0: must be in \[0, 1\)"),
    ("train.step_loss_decay=0", r"train.step_loss_decay=0.0: must be in \(0, 1\]"),
    ("train.lr=0", r"train.lr=0.0: must be > 0"),
    ("train.source=stream", r"train.source='stream': must be one of offline, online"),
    ("train.loss=tv", r"train.loss='tv': must be one of kl, ce"),
    ("train.online.queue_steps=0", r"train.online.queue_steps=0: must be >= 1"),
    ("data.demo.multi_turn_fraction=1.5", r"must be in \[0, 1\]"),
    ("extract.dtype=bf16", r"extract.dtype='bf16': must be one of float32, bfloat16, float16"),
    ("target.builtin.num_heads=3", r"hidden_size=256 is not divisible by .*num_heads=3"),
])
def test_out_of_range_values_stop_before_work(override, message):
    with pytest.raises(ConfigError, match=message):
        load_config([override])


def test_predicted_tau_follows_the_served_k():
    assert load_config([]).eval.steps == 3
    assert load_config(["serve.num_speculative_tokens=5"]).eval.steps == 5
    assert load_config(["serve.num_speculative_tokens=5", "eval.steps=5"]).eval.steps == 5


def test_a_foreign_draft_may_be_served_with_any_k():
    cfg = load_config(["serve.draft=/drafts/other", "serve.num_speculative_tokens=10"])
    assert cfg.serve.num_speculative_tokens == 10


@pytest.mark.parametrize("override,message", [
    ("extract.layout.draft_inputs=[block_out:0,block_out:9]",
     r"extract.layout.draft_inputs=\['block_out:0', 'block_out:9'\].*slot block_out:9 is out "
     r"of range: the target has 4 decoder blocks"),
    ("extract.layout.draft_inputs=[block_out:0,blockout:1]", r"unknown hidden-state slot"),
    ("extract=default", r"vLLM's default ids .* collapse"),
    ("extract.stages_per_replica=5", r"only 4 decoder blocks"),
])
def test_preflight_checks_the_layout_against_the_target(override, message):
    from workflows.config import preflight

    cfg = load_config([override])  # valid alone: only the target's depth refutes it
    with pytest.raises(ConfigError, match=message):
        preflight(cfg)


def test_preflight_reads_a_local_targets_depth(tmp_path):
    import json

    from workflows.config import preflight

    (tmp_path / "config.json").write_text(json.dumps(
        {"architectures": ["LlamaForCausalLM"], "num_hidden_layers": 12, "hidden_size": 64}))
    preflight(load_config(["target=local", f"target.path={tmp_path}",
                           "extract.layout.draft_inputs=[block_out:0,block_out:9]"]))
    with pytest.raises(ConfigError, match=r"target.path=/nowhere: no such directory"):
        preflight(load_config(["target=local", "target.path=/nowhere"]))
