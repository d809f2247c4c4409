"""Role prefixes/suffixes derived from Jinja chat templates reproduce the template's own
rendering of whole conversations (the truth: jinja2 rendering, as apply_chat_template does)."""

from __future__ import annotations

import jinja2
import pytest
from frontend_fake_backend import SMOLLM_TEMPLATE

from radixrt.frontend.chat_template import PLAIN, from_jinja, from_tokenizer_config

LLAMA3 = (
    "{{ bos_token }}{% for message in messages %}"
    "{{ '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n' + message['content'] | trim + '<|eot_id|>' }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}"
)

QWEN_LIKE = (
    "{% for message in messages %}"
    "{% if loop.first and message['role'] != 'system' %}<|im_start|>system\nYou are Qwen.<|im_end|>\n{% endif %}"
    "<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)

NO_SYSTEM = (
    "{% for message in messages %}{% if message['role'] == 'system' %}"
    "{{ raise_exception('System role not supported') }}{% endif %}"
    "<start_of_turn>{{ 'model' if message['role'] == 'assistant' else message['role'] }}\n"
    "{{ message['content'] }}<end_of_turn>\n{% endfor %}"
)

CONVERSATIONS = [
    [
        {"role": "user", "content": "Hi there"},
        {"role": "assistant", "content": "Hello!"},
        {"role": "user", "content": "How are you?"},
        {"role": "assistant", "content": "Fine."},
    ],
    [
        {"role": "system", "content": "Be terse."},
        {"role": "user", "content": "2+2?"},
        {"role": "assistant", "content": "4"},
    ],
]


def _truth(template: str, messages: list[dict], bos: str = "") -> str:
    env = jinja2.sandbox.ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)

    def raise_exception(msg):
        raise jinja2.exceptions.TemplateError(msg)

    env.globals["raise_exception"] = raise_exception
    return env.from_string(template).render(
        messages=messages, bos_token=bos, add_generation_prompt=False
    )


@pytest.mark.parametrize(
    "template", [SMOLLM_TEMPLATE, LLAMA3, QWEN_LIKE], ids=["smollm", "llama3", "qwen"]
)
@pytest.mark.parametrize("conversation", CONVERSATIONS, ids=["no-system", "system"])
def test_derived_roles_reproduce_the_template(template, conversation):
    chat = from_jinja(template, bos_token="<s>" if template is LLAMA3 else "")
    bos = "<s>" if template is LLAMA3 else ""
    truth = _truth(template, conversation, bos)
    rendered = chat.render(conversation)
    # the Llama-3 BOS sits in the first role's prefix; derived spans put it in the system prefix
    assert rendered.replace("<s>", "") == truth.replace("<s>", "")


def test_default_system_prompts_and_stop_strings():
    assert from_jinja(SMOLLM_TEMPLATE).default_system_prompt.startswith(
        "You are a helpful AI assistant"
    )
    assert from_jinja(QWEN_LIKE).default_system_prompt == "You are Qwen."
    assert from_jinja(LLAMA3).default_system_prompt is None
    assert from_jinja(SMOLLM_TEMPLATE).stop_str == ("<|im_end|>",)
    assert from_jinja(LLAMA3).stop_str == ("<|eot_id|>",)


def test_template_without_system_role():
    chat = from_jinja(NO_SYSTEM)
    assert "system" not in chat.role_prefix_and_suffix
    assert chat.get_prefix_and_suffix("assistant") == ("<start_of_turn>model\n", "<end_of_turn>\n")
    with pytest.raises(ValueError, match="system"):
        chat.get_prefix_and_suffix("system")


def test_missing_or_broken_template_falls_back_to_plain():
    assert from_tokenizer_config(None) is PLAIN
    assert from_tokenizer_config("{{ messages[0]['content'][ }}") is PLAIN
    # drops content
    assert from_tokenizer_config("{% for m in messages %}static{% endfor %}") is PLAIN
