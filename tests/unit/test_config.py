"""Config composition: every YAML composes, README overrides work, errors name the key."""
import re
import shlex
from dataclasses import fields, is_dataclass
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from eyas.config import STAGES, PipelineConfig
from workflows.config import (CONF_DIR, GLOBAL_HEADER, GROUPS, ConfigError, flatten, load_config,
                              registered_choices, to_yaml)

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
    commands = [shlex.split(re.split(r"eyas run|workflows\.pipeline", line, maxsplit=1)[1])
                for line in lines]
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
    ("stages=[prepare,extrct]", "stages: unknown item 'extrct'.*did you mean 'extract'"),
    ("serve.concurrency=[1,0]", r"serve.concurrency=\[1, 0\]: each item must be >= 1 \(requests in "
                                r"flight at once\)"),
    ("serve.concurrency=[]", "serve.concurrency=\\[\\]: each item must be >= 1"),
    ("target=nope", "no conf/target/nope.yaml; choices for target: builtin, local"),
    ("experiment=nope", "experiments: chat, deep, published-recipe, tiny"),
    ("data.on_bad_record=ignore", "data.on_bad_record='ignore': must be one of error, skip"),
    ("target=local", "target=local needs target.path"),
    ("run_dir", "not of the form key=value"),
    # no top-level seed (it seeded nothing): each stage has its own
    ("seed=1", "unknown config key 'seed'; did you mean 'train.seed'"),
    # no eval.steps: evaluate scores at serve.num_speculative_tokens, the k served
    ("eval.steps=5", "unknown config key 'eval.steps'"),
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
    ("train.lr=!!python/object/apply:os.system ['touch {canary}']",
     r"train.lr: the YAML tag !!python/object/apply:os.system is not allowed"),
    ("train.lr=!!python/name:os.system", r"train.lr: the YAML tag !!python/name:os.system"),
    ("train.lr=!!binary aGVsbG8=", r"train.lr: the YAML tag !!binary is not allowed"),
    ("train.seed=!!int 3", r"train.seed: the YAML tag !!int is not allowed"),
    ("train.lr=&a 3", r"train.lr: the YAML anchor &a is not allowed"),
    ("train.seed=*a", r"train.seed: the YAML alias \*a is not allowed"),
    ("stages=[prepare, &x extract, *x]", r"stages\[1\]: the YAML anchor &x"),
    ("train={lr: 1, seed: !!python/object/apply:os.system ['touch {canary}']}",
     r"train.seed: the YAML tag !!python/object/apply:os.system"),
    ("train.lr={a: 1}", r"bad value for 'train.lr'"),
    ("target.path={a: 1}", r"bad value for 'target.path'"),
    ("stages={a: 1}", r"override 'stages=\{a: 1\}': bad value"),
    ("train.lr=[1", r"override 'train.lr=\[1': not valid YAML"),
])
def test_hostile_override_values_are_refused_naming_the_key(override, message, tmp_path):
    """A value that is not a plain scalar, list or section is bad input (an `eyas:` paragraph,
    exit 2), never a YAML traceback; and nothing in it is constructed, let alone executed."""
    from workflows.errors import BAD_INPUT, explain

    canary = tmp_path / "executed"
    with pytest.raises(ConfigError, match=message) as err:
        load_config([override.replace("{canary}", str(canary))])
    assert not canary.exists()
    import io
    out = io.StringIO()
    assert explain(err.value, stream=out) == BAD_INPUT
    assert out.getvalue().startswith("eyas: ")


def test_hostile_yaml_in_a_preset_file_is_refused_naming_file_line_and_key(tmp_path):
    conf = tmp_path / "conf"
    for group in GROUPS:
        (conf / group).mkdir(parents=True)
    canary = tmp_path / "executed"
    (conf / "config.yaml").write_text("defaults:\n  train: mine\nstages: [prepare]\n")
    (conf / "train" / "mine.yaml").write_text(
        f"lr: 0.001\nseed: !!python/object/apply:os.system ['touch {canary}']\n")
    with pytest.raises(ConfigError, match=r"^seed: the YAML tag !!python/object/apply:os.system "
                                          r"is not allowed \(.*mine.yaml, line 2\)"):
        load_config([], conf_dir=conf)
    assert not canary.exists()
    (conf / "train" / "mine.yaml").write_text("base: &b 3\nttt_steps: *b\n")
    with pytest.raises(ConfigError, match=r"^base: the YAML anchor &b .*mine.yaml, line 1"):
        load_config([], conf_dir=conf)


@pytest.mark.parametrize("override,message", [
    ("train.batch_size=-3", r"train.batch_size=-3: must be >= 1"),
    ("train.epochs=0", r"train.epochs=0: must be >= 1"),
    ("extract.samples_per_shard=0", r"extract.samples_per_shard=0: must be >= 1"),
    ("serve.num_speculative_tokens=0", r"serve.num_speculative_tokens=0: must be >= 1"),
    ("serve.num_speculative_tokens=100", r"serve.num_speculative_tokens=100 exceeds "
                                         r"train.ttt_steps=7.*<=7"),
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
    ("draft.hidden_size=1000000000", r"draft.hidden_size=1000000000: must be in \[1, 65536\]"),
    ("target.builtin.vocab_size=100000000", r"target.builtin.vocab_size=100000000: must be in "),
])
def test_out_of_range_values_stop_before_work(override, message):
    with pytest.raises(ConfigError, match=message):
        load_config([override])


@pytest.mark.parametrize("overrides,message", [
    (["draft.num_layers=2"], r"draft.num_layers=2: an eagle3 draft has one decoder layer"),
    (["draft.family=eagle3.1", "draft.num_layers=3"], r"an eagle3.1 draft has one"),
    (["draft.block_size=4"], r"draft.block_size=4 is a dflash draft's"),
    (["train.anchors=64"], r"train.anchors=64 samples a dflash draft's block anchors"),
    (["draft.family=dflash", "draft.block_size=8"],
     r"draft.block_size=8 with serve.num_speculative_tokens=3: .*"
     r"serve.num_speculative_tokens=7"),
    (["draft.family=medusa"], r"draft.family='medusa': must be one of eagle3, eagle3.1, peagle, "
                              r"dflash"),
])
def test_family_settings_that_do_not_fit_stop_before_work(overrides, message):
    with pytest.raises(ConfigError, match=message):
        load_config(overrides)


def test_a_dflash_draft_on_the_embedding_stops_before_work():
    from workflows.plan import preflight

    with pytest.raises(ConfigError, match=r"draft_inputs=\['embed', 'block_out:1', 'block_out:2'\]"
                                          r".*cannot be fed the embedding output"):
        preflight(load_config(["draft.family=dflash",
                               "extract.layout.draft_inputs=[embed,block_out:1,block_out:2]"]))
    preflight(load_config(["extract.layout.draft_inputs=[embed,block_out:1,block_out:2]"]))


def test_a_dflash_block_follows_the_served_k():
    """A DFlash block of B is served as B-1 drafts: unset, the block is k+1, and training
    does not hold k to train.ttt_steps (a DFlash draft's positions are its block's)."""
    cfg = load_config(["draft.family=dflash", "serve.num_speculative_tokens=9"])
    assert cfg.draft.block_size == 10
    assert load_config(["draft.family=dflash"]).draft.block_size == 4
    assert load_config(["draft.family=peagle"]).draft.block_size is None


def test_predicted_tau_follows_the_served_k():
    from workflows.stages import STAGES as STAGE_DECLS

    assert "serve.num_speculative_tokens" in STAGE_DECLS["evaluate"].reads(load_config([]))
    base, k5 = _stage_keys([]), _stage_keys(["serve.num_speculative_tokens=5"])
    assert k5["evaluate"] != base["evaluate"] and k5["serve"] != base["serve"]
    assert k5["train"] == base["train"]


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
    ("extract.layout.spread=3", r"extract.layout.spread=3.*both name the slots: set one"),
])
def test_preflight_checks_the_layout_against_the_target(override, message):
    from workflows.plan import preflight

    cfg = load_config([override])  # valid alone: only the target's depth refutes it
    with pytest.raises(ConfigError, match=message):
        preflight(cfg)


def test_preflight_reads_a_local_targets_depth(tmp_path):
    import json

    from workflows.plan import preflight

    (tmp_path / "config.json").write_text(json.dumps(
        {"architectures": ["LlamaForCausalLM"], "num_hidden_layers": 12, "hidden_size": 64}))
    preflight(load_config(["target=local", f"target.path={tmp_path}",
                           "extract.layout.draft_inputs=[block_out:0,block_out:9]"]))
    with pytest.raises(ConfigError, match=r"target.path=/nowhere: no such directory"):
        preflight(load_config(["target=local", "target.path=/nowhere"]))


def test_preflight_resolves_the_layout_once_into_the_runs_plan():
    from eyas.layout import LayoutError, TargetIdentity
    from workflows.plan import preflight

    plan = preflight(load_config([]))
    assert plan.target == TargetIdentity("LlamaForCausalLM", 4, 256)
    assert plan.layout.names == ["block_out:0", "block_out:1", "block_out:2"]
    deep = preflight(load_config(["experiment=deep", "target.builtin.num_layers=8",
                                  "extract.layout.draft_inputs=null"]))
    assert deep.layout.names == ["block_out:1", "block_out:3", "block_out:4"]  # the default
    assert deep.layout.verifier.name == "block_out:7"
    # on the prepared target (its fingerprints now known) the planned slots stay
    prepared = TargetIdentity("LlamaForCausalLM", 4, 256, "w", "t", "c")
    layout = plan.layout_on(prepared)
    assert layout.target == prepared and layout.draft_inputs == plan.layout.draft_inputs
    with pytest.raises(ConfigError, match=r"prepared target \(LlamaForCausalLM, 6 blocks .* not "
                                          r"the one the config names .*4 blocks.*add prepare"):
        plan.layout_on(TargetIdentity("LlamaForCausalLM", 6, 256, "w"))
    # the prepare stage alone needs no layout: one that does not resolve is noted, not refused
    alone = preflight(load_config(["stages=[prepare]", "extract=default"]))
    assert alone.layout is None and "collapse" in alone.unresolved
    with pytest.raises(LayoutError, match="collapse"):
        alone.layout_on(prepared)


def _stage_keys(overrides: list[str]) -> dict[str, str]:
    """Each stage's cache key for a config, its upstream outputs held fixed: what changes a
    key here is the config the stage reads, nothing else."""
    from workflows.pipeline import stage_key
    from workflows.stages import STAGES as STAGE_DECLS, RunState

    cfg = load_config(overrides)
    state = RunState(cfg, Path("/nowhere"), None, None,
                     fingerprints=dict.fromkeys(STAGE_DECLS, "fp"))
    return {name: stage_key(cfg, stage, state)[0] for name, stage in STAGE_DECLS.items()}


@pytest.mark.parametrize("overrides,changed", [
    (["serve.concurrency=[1,8]"], {"serve"}),  # a wider sweep does not redo evaluation
    (["train.lr=1e-3"], {"train"}),
    (["serve.draft=/drafts/other"], {"evaluate", "serve"}),
    (["eval.num_prompts=2"], {"evaluate"}),
    # extract loads the target in it; serve.dtype follows it (the engine computes in it)
    (["target.dtype=bfloat16"], {"prepare", "extract", "serve"}),
    (["train.source=online"], {"extract", "train"}),
    (["extract.num_replicas=2"], {"extract"}),  # offline, train reads the stored shards only
    (["extract.layout.spread=1"], {"extract"}),
    (["mlflow.experiment=other", "run_dir=/elsewhere"], set()),
])
def test_a_stage_key_digests_what_the_stage_reads(overrides, changed):
    base, new = _stage_keys([]), _stage_keys(overrides)
    assert {s for s in base if base[s] != new[s]} == changed


def test_a_key_added_since_leaves_finished_extractions_theirs():
    """extract.layout.spread came after runs had extracted: at its default the extract key is
    the one eyas computed before it existed (commit 7a99e80), so upgrading redoes no
    extraction; set, it is digested like any other key (the case above)."""
    assert _stage_keys([])["extract"] == "883abb5a3aef86b0"
    assert _stage_keys(["experiment=chat"])["extract"] == "1662083c0f5765b5"


def test_online_training_reads_the_replicas_settings():
    online = _stage_keys(["train.source=online"])
    more = _stage_keys(["train.source=online", "extract.num_replicas=2"])
    assert {s for s in online if online[s] != more[s]} == {"extract", "train"}


# Every key of PipelineConfig, in declaration order: adding, removing or moving one is a
# deliberate change of this list.
CONFIG_KEYS = """
stages run_dir
target.path target.packaged target.dtype target.builtin.vocab_size target.builtin.hidden_size
target.builtin.num_layers target.builtin.num_heads target.builtin.num_kv_heads
target.builtin.intermediate_size target.builtin.max_position_embeddings
target.builtin.rope_theta target.builtin.seq_len target.builtin.batch_size
target.builtin.train_steps target.builtin.lr target.builtin.warmup_steps
target.builtin.eval_tokens target.builtin.heldout_fraction target.builtin.max_corpus_mb
target.builtin.seed target.builtin.cache_dir
data.train_files data.heldout_files data.max_length data.max_train data.max_heldout
data.on_bad_record data.demo.source
data.demo.num_train
data.demo.num_heldout data.demo.prompt_lines data.demo.completion_lines
data.demo.multi_turn_fraction data.demo.seed data.regenerate data.generation.temperature
data.generation.top_p data.generation.max_new_tokens data.generation.seed
data.generation.on_truncated data.generation.num_replicas data.generation.gpus_per_replica
extract.layout.draft_inputs extract.layout.spread extract.layout.verifier extract.backend
extract.dtype
extract.samples_per_shard extract.batch_tokens extract.num_replicas extract.gpus_per_replica
extract.stages_per_replica extract.probe_samples
draft.family draft.num_layers draft.block_size draft.markov_rank draft.vocab_size draft.hidden_size draft.num_heads draft.intermediate_size
draft.norm_before_fc draft.fc_norm draft.norm_before_residual draft.norm_output
train.source train.online.queue_steps train.online.keep_epoch train.num_workers
train.ttt_steps train.epochs train.batch_size train.lr train.step_loss_decay train.adam_beta2
train.freeze_lm_head train.lm_head_init train.ttt_scheme train.loss_tokens train.loss
train.target_cache_gib
train.precision train.anchors train.checkpoint_every train.seed
eval.gap_tolerance eval.max_train_samples eval.num_prompts eval.max_new_tokens
serve.engine serve.dtype serve.cpu_threads serve.draft serve.num_speculative_tokens serve.num_prompts serve.max_new_tokens
serve.concurrency serve.interleave serve.force serve.prompt_sets serve.gap_z
mlflow.tracking_uri mlflow.experiment mlflow.run_name
""".split()


def _fields(node, prefix=""):
    for f in fields(node):
        value = getattr(node, f.name)
        if is_dataclass(value):
            yield from _fields(value, f"{prefix}{f.name}.")
        else:
            yield f"{prefix}{f.name}", f, value


def test_the_config_key_set_is_pinned():
    assert [key for key, _, _ in _fields(PipelineConfig())] == CONFIG_KEYS


def _out_of_range(rng, default):
    if rng.high is not None and not isinstance(default, int):
        return rng.high + 1
    step = 1 if isinstance(default, int) or default is None else 0.5
    return rng.low if rng.open_low else rng.low - step


@pytest.mark.parametrize("key,field", [(k, f) for k, f, _ in _fields(PipelineConfig())
                                       if f.metadata])
def test_every_declared_choice_and_range_is_checked(key, field):
    """The fields' own declarations are what is checked, nested sections included."""
    if "choices" in field.metadata:
        for allowed in field.metadata["choices"]:
            load_config([f"{key}={'null' if allowed is None else allowed}"])
        with pytest.raises(ConfigError, match=rf"{re.escape(key)}='nope': must be one of "):
            load_config([f"{key}=nope"])
    elif "registry" in field.metadata:  # its choices are the registry's entries
        for allowed in registered_choices(field):  # (without serve: a CPU machine's vLLM
            # does not serve every family: test_dspark_run.py's refusal)
            load_config([f"{key}={allowed}", "stages=[prepare,extract,train,evaluate]"])
        with pytest.raises(ConfigError, match=rf"{re.escape(key)}='nope': must be one of "):
            load_config([f"{key}=nope"])
    elif "each_choices" in field.metadata:
        load_config([f"{key}=[{','.join(field.metadata['each_choices'])}]"])
        with pytest.raises(ConfigError, match=rf"^{re.escape(key)}: unknown item 'nope'"):
            load_config([f"{key}=[{field.metadata['each_choices'][0]},nope]"])
    elif "each_range" in field.metadata:
        low = field.metadata["each_range"].low
        load_config([f"{key}=[{low},{low + 1}]"])
        with pytest.raises(ConfigError, match=rf"^{re.escape(key)}=.*: each item must be "):
            load_config([f"{key}=[{low},{low - 1}]"])
    else:
        rng = field.metadata["range"]
        bad = [_out_of_range(rng, field.default)]
        if rng.high is not None and isinstance(field.default, int) or field.default is None:
            bad.append(int(rng.high) + 1 if rng.high is not None else None)  # above the ceiling
        for value in [b for b in bad if b is not None]:
            with pytest.raises(ConfigError, match=rf"^{re.escape(key)}=.*: must be "):
                load_config([f"{key}={value}"])


@pytest.mark.parametrize("path", sorted(p for g in GROUPS for p in (CONF_DIR / g).glob("*.yaml")),
                         ids=lambda p: f"{p.parent.name}/{p.stem}")
def test_group_presets_state_only_what_differs_from_the_schema(path):
    schema = OmegaConf.structured(PipelineConfig)
    node = OmegaConf.load(path)
    if not path.read_text().startswith(GLOBAL_HEADER):
        node = OmegaConf.create({path.parent.name: node})
    restated = []

    def walk(n, prefix):
        for k in n.keys():
            key = f"{prefix}{k}"
            if OmegaConf.is_dict(n._get_node(k)):
                walk(n[k], f"{key}.")
            elif not OmegaConf.is_missing(n, k) and \
                    OmegaConf.to_container(n, resolve=False)[k] == OmegaConf.select(schema, key):
                restated.append(key)
    walk(node, "")
    assert not restated, f"{path} restates the schema's defaults of {restated}"


def test_a_missing_vllm_is_refused_before_any_stage(monkeypatch):
    """Serving and regeneration boot vLLM at the end of their stages' budgets: its absence is
    said before the first stage, naming the keys that need it."""
    import importlib.util

    from workflows.plan import preflight

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "vllm" else real(name, *a))
    with pytest.raises(ConfigError, match=r"^serve.engine=vllm, data.regenerate=true: vLLM is "
                                          "not installed"):
        preflight(load_config([]))
    preflight(load_config(["serve=reference", "data.regenerate=false"]))  # needs none
