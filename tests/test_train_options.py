"""The adapter options of a training run are checked once (`sbd.training.options`), for the command line's
`TrainConfig` and Python's `SBDTrainer` alike, each naming them as its user wrote them."""

import pytest

from sbd.errors import SBDError
from sbd.training.options import CLI, PYTHON, check_adapter_options

BAD = [  # (options, what the message says, with {name} for the interface's spelling)
    (dict(adapter=False, kl_weight=0.5), "{kl_weight} applies to drafting-adapter runs only ({adapter})"),
    (dict(adapter=False, grad_layer=2, position_decay=0.5),
     "{grad_layer} and {position_decay} apply to drafting-adapter runs only"),
    (dict(adapter=True, kl_weight=-1), "{kl_weight} must be a number >= 0"),
    (dict(adapter=True, latent_weight=float("nan")), "{latent_weight} must be a number >= 0"),
    (dict(adapter=True, grad_layer=-1), "{grad_layer} must be an integer >= 0"),
    (dict(adapter=True, position_decay=1.5), "{position_decay} must lie in (0, 1]"),
    (dict(adapter=True, head_only=True, latent_weight=0.1), "{head_only} trains no adapter"),
]


@pytest.mark.parametrize("spell", [CLI, PYTHON], ids=["cli", "python"])
@pytest.mark.parametrize("options,says", BAD)
def test_each_mistake_is_named_in_the_interfaces_words(spell, options, says):
    kw = {"head_only": False, **options}
    with pytest.raises(SBDError) as err:
        check_adapter_options(spell, **kw)
    assert says.format(**spell) in str(err.value)


def test_both_interfaces_refuse_the_same_settings_in_their_own_words(tmp_path):
    from sbd.training.run import TrainConfig

    with pytest.raises(SBDError, match="--kl-weight applies to drafting-adapter runs only"):
        TrainConfig(model="demo", data="d.jsonl", out=str(tmp_path), kl_weight=0.5)
    with pytest.raises(SBDError, match="--sampler-head-only trains no adapter"):
        TrainConfig(model="demo", data="d.jsonl", out=str(tmp_path), adapter="lora", sampler_head_only=True,
                    train_layers_from=3)
    import sbd
    from sbd.training.trainer import SBDTrainer

    model, tok = sbd.load("demo")
    with pytest.raises(SBDError, match="kl_weight applies to drafting-adapter runs only \\(mode='adapter'\\)"):
        SBDTrainer(model, train_dataset=[{"input_ids": [1, 2, 3], "prompt_length": 1}], mode="sbd", kl_weight=0.5,
                   show_progress=False)
    check_adapter_options(PYTHON, adapter=True, head_only=False, kl_weight=1.0, latent_weight=0.5, grad_layer=4,
                          position_decay=0.7)  # a run that reads them all: nothing to say
