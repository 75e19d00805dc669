"""`chat=True`: prompts go through the tokenizer's chat template (instruct models), in `generate`,
`sbd generate --chat` and `sbd bench --chat`; a tokenizer without a template is a one-line error."""

import copy

import pytest

import sbd
from conftest import blocks
from sbd import SBDError
from sbd.cli.main import main
from sbd.decoding.generate import encode_prompts

TEMPLATE = ("{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}\n{% endfor %}"
            "{% if add_generation_prompt %}<assistant>{% endif %}")


@pytest.fixture
def chat_tokenizer(tokenizer):
    tok = copy.deepcopy(tokenizer)
    tok.chat_template = TEMPLATE
    return tok


def test_a_string_becomes_a_user_turn_with_the_assistant_turn_opened(chat_tokenizer):
    ids = encode_prompts(chat_tokenizer, ["12 + 34"], chat=True)[0]
    assert chat_tokenizer.decode(ids) == "<user>12 + 34\n<assistant>"
    conversation = [{"role": "system", "content": "Add."}, {"role": "user", "content": "1 + 2"}]
    ids = encode_prompts(chat_tokenizer, conversation, chat=True)[0]  # one conversation
    assert chat_tokenizer.decode(ids) == "<system>Add.\n<user>1 + 2\n<assistant>"
    assert encode_prompts(chat_tokenizer, ["12 + 34"])[0] == chat_tokenizer("12 + 34").input_ids  # chat off


def test_generate_with_chat_decodes_the_templated_prompt(llama, chat_tokenizer):
    templated = chat_tokenizer("<user>12 + 34\n<assistant>", add_special_tokens=False).input_ids
    for method in ("ntp", "sbd", "sbd-verify"):
        a = sbd.generate(llama, chat_tokenizer, ["12 + 34"], method=method, **blocks(method, 4), max_new_tokens=10,
                         chat=True)
        b = sbd.generate(llama, chat_tokenizer, [templated], method=method, **blocks(method, 4), max_new_tokens=10)
        assert a.token_ids == b.token_ids and a.prompt_lengths == [len(templated)]


def test_no_template_is_a_one_line_error(llama, tokenizer, tmp_path, capsys):
    with pytest.raises(SBDError, match="^chat=True needs a tokenizer with a chat template") as e:
        sbd.generate(llama, tokenizer, ["hi"], method="sbd", chat=True)
    assert "without chat=True" in str(e.value)
    with pytest.raises(SBDError, match="role"):
        encode_prompts(tokenizer, [[{"content": "no role"}]], chat=True)
    from sbd.models import tiny

    tiny.create(tmp_path / "m", vocab_size=300, hidden=32, layers=1, heads=2, kv_heads=1, context=128)
    assert main(["generate", "--model", str(tmp_path / "m"), "hi", "--chat", "--max-new-tokens", "4"]) == 2
    err = capsys.readouterr().err.strip()  # in the command line's words: its flag, not the keyword
    assert err.startswith("sbd: error: --chat needs a tokenizer with a chat template") and "\n" not in err, err
    assert "without --chat" in err and "chat=" not in err, err
