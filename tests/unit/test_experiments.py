"""Experiments that choose groups (conf/experiment/*.yaml `defaults:`), and the real-chat
presets they pick (data=sharegpt, experiment=chat)."""
import pytest


def test_an_experiment_chooses_groups_and_the_command_line_wins():
    from workflows.config import compose

    cfg = compose(["experiment=chat"])
    assert cfg.target.packaged == "smollm2" and cfg.data.train_files == ["builtin:sharegpt"]
    assert cfg.data.max_train == 32 and cfg.data.generation.num_replicas == 2
    mine = compose(["experiment=chat", "data=demo"])
    assert mine.target.packaged == "smollm2" and mine.data.train_files == []


def test_an_experiment_choosing_a_missing_group_file_is_refused(tmp_path):
    import shutil

    from workflows.config import CONF_DIR, ConfigError, compose

    conf = tmp_path / "conf"
    shutil.copytree(CONF_DIR, conf)
    (conf / "experiment" / "bad.yaml").write_text("defaults:\n  target: nowhere\n")
    with pytest.raises(ConfigError, match="defaults target=nowhere: no conf/target/nowhere.yaml"):
        compose(["experiment=bad"], conf_dir=conf)


def test_real_chat_data_skips_and_counts_records_it_cannot_train_on():
    """A ShareGPT chat whose first user turn alone passes data.max_length stopped a 640-chat
    run after 15 minutes of regeneration; data=sharegpt skips such records and counts them."""
    from workflows.config import compose

    assert compose(["data=sharegpt"]).data.on_bad_record == "skip"
    assert compose(["experiment=chat"]).data.on_bad_record == "skip"
