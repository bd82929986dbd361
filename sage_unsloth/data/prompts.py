"""The paper's prompt format, shared by SFT, RLVR and evaluation so the three stages cannot drift.

A completion looks like ``<start_working_out>{thoughts}<end_working_out><SOLUTION>{answer}</SOLUTION>``.
The chat template renders a plain-text conversation for *base* models (no role tokens): system prompt,
a blank line, the user turn, a blank line, then the assistant turn. The generation prompt ends with
``<start_working_out>`` so sampling starts inside the working-out block, exactly where SFT taught it to.
"""

from __future__ import annotations

REASONING_START = "<start_working_out>"
REASONING_END = "<end_working_out>"
SOLUTION_START = "<SOLUTION>"
SOLUTION_END = "</SOLUTION>"

# Verbatim from the official SAGE code.
SYSTEM_PROMPT = (
    "You are given a problem.\n"
    "Think about the problem and provide your working out.\n"
    f"Place it between {REASONING_START} and {REASONING_END}.\n"
    f"Then, provide your solution between {SOLUTION_START}{SOLUTION_END}"
)

# The official evaluator's user turn (training uses the bare problem text).
EVAL_USER_TEMPLATE = "Problem: {problem}\n\nSolve this step by step and provide your final numerical answer."

# `{% generation %}` marks the assistant tokens so TRL's assistant_only_loss trains on them alone. The
# leading <start_working_out> of an assistant turn is rendered outside the marked span because at
# inference it is part of the prompt (add_generation_prompt), never something the model writes.
CHAT_TEMPLATE = (
    "{%- if messages[0]['role'] == 'system' -%}"
    "{{ messages[0]['content'] }}{%- set loop_messages = messages[1:] -%}"
    "{%- else -%}"
    "{{ '" + SYSTEM_PROMPT.replace("\n", "\\n") + "' }}{%- set loop_messages = messages -%}"
    "{%- endif -%}"
    "{%- for message in loop_messages -%}"
    "{%- if message['role'] == 'user' -%}"
    "{{ '\\n\\n' + message['content'] + '\\n\\n' }}"
    "{%- elif message['role'] == 'assistant' -%}"
    "{{ '" + REASONING_START + "' }}"
    "{% generation %}{{ message['content'] | replace('" + REASONING_START + "', '', 1) + eos_token }}"
    "{% endgeneration %}"
    "{%- endif -%}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{ '" + REASONING_START + "' }}{%- endif -%}"
)


def format_completion(thoughts: str, answer: str) -> str:
    """The assistant text SFT teaches: working out, then the answer in a solution block."""
    return f"{REASONING_START}{thoughts.strip()}{REASONING_END}{SOLUTION_START}{answer.strip()}{SOLUTION_END}"


def prompt_messages(problem: str) -> list[dict[str, str]]:
    """System + user messages for one problem (the conversational format TRL trainers take)."""
    return [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": problem}]
