"""The shipped SmolLM2 drafter's provenance agrees with itself (files only: no model needed).

The model card (README.md), the machine-readable training record and the weight files in
sbd/adapters/smollm2 must tell the same story: sequences seen are the sum of the runs, each run's
sequences are its steps × batch, the record's adapter shape is the saved tensors' shape, and the card
quotes the record's totals. A card left behind when the weights change fails here."""

from __future__ import annotations

import json
import re

import pytest
from safetensors import safe_open

from sbd.models.names import ADAPTERS_DIR

FOLDER = ADAPTERS_DIR / "smollm2"


@pytest.fixture(scope="module")
def record() -> dict:
    return json.loads((FOLDER / "training_record.json").read_text())


def shapes(name: str) -> dict:
    with safe_open(str(FOLDER / name), "pt") as f:
        return {k: tuple(f.get_slice(k).get_shape()) for k in f.keys()}


def test_sequences_seen_are_the_sum_of_the_runs(record):
    adapter = [r for r in record["runs"] if r["part"] == "adapter"]
    head = [r for r in record["runs"] if r["part"] == "sampler head"]
    assert adapter and head
    for run in record["runs"]:
        assert run["sequences_seen"] == run["steps"] * run["batch_size"], run
    assert record["sequences_seen"] == sum(r["sequences_seen"] for r in adapter)
    assert record["head_sequences_seen"] == sum(r["sequences_seen"] for r in head)
    assert record["sampler_head"]["sequences_seen"] == record["head_sequences_seen"]
    assert record["sampler_head"]["steps"] == sum(r["steps"] for r in head)
    assert sum(record["sources"].values()) == record["distinct_answers"]


def test_the_record_describes_the_saved_weights(record):
    config = json.loads((FOLDER / "adapter_config.json").read_text())
    assert config["r"] == record["adapter"]["rank"] and config["lora_alpha"] == record["adapter"]["alpha"]
    assert sorted(config["target_modules"]) == sorted(record["adapter"]["target_modules"])
    lora = shapes("adapter_model.safetensors")
    a = {k: s for k, s in lora.items() if k.endswith("lora_A.weight")}
    assert a and all(s[0] == config["r"] for s in a.values())
    assert {k.split(".")[-3] for k in a} == set(config["target_modules"])
    head_config = json.loads((FOLDER / "sampler_head_config.json").read_text())
    assert head_config["width"] == record["sampler_head"]["width"]
    head = shapes("sampler_head.safetensors")
    assert head["up.weight"] == (head_config["width"], 2 * head_config["hidden_size"])
    assert head["down.weight"] == (head_config["hidden_size"], head_config["width"])


def test_the_model_card_quotes_the_record(record):
    card = (FOLDER / "README.md").read_text()
    front = re.match(r"---\n(.*?)\n---\n", card, re.S)
    assert front and "base_model:" in front.group(1)
    for key in ("sequences_seen", "head_sequences_seen", "distinct_answers"):
        assert f"{record[key]:,}" in card, f"the card does not quote {key} = {record[key]:,}"
