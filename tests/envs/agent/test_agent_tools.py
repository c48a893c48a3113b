"""Tool calls and built-in environments: parsing (good, malformed, several per turn) in the
Hermes and compact forms, the calculator, the tools and guess_number environments, and the
prompt rendered with `apply_chat_template(tools=...)` by a Hermes-style template."""

from __future__ import annotations

import pytest

from hybridflow.data.tokenizer import build_char_tokenizer
from hybridflow.envs.agent import resolve_agent_env
from hybridflow.envs.agent.builtin import GuessNumberEnv, ToolEnv
from hybridflow.envs.agent.render import ChatRenderer
from hybridflow.envs.agent.toolcall import ToolCall, ToolCallError, parse_tool_calls
from hybridflow.envs.agent.tools import CALCULATOR, evaluate
from hybridflow.errors import ConfigError


def test_hermes_calls_good_several_and_malformed():
    text = ('I will compute.<tool_call>\n{"name": "calculator", "arguments": {"expression": "12*3"}}\n</tool_call>'
            '<tool_call>{"name": "python", "arguments": "{\\"code\\": \\"print(1)\\"}"}</tool_call>'
            '<tool_call>{"name": "calculator", "arguments": {"expression": </tool_call>'
            '<tool_call>["not an object"]</tool_call><tool_call>{"name": "x", "arguments": 3}</tool_call>'
            '<tool_call>{"name": "calculator"')
    calls = parse_tool_calls(text, "hermes")
    assert calls[0] == ToolCall("calculator", {"expression": "12*3"})
    assert calls[1] == ToolCall("python", {"code": "print(1)"})  # arguments given as a JSON string
    assert isinstance(calls[2], ToolCallError) and "not valid JSON" in calls[2].message
    assert isinstance(calls[3], ToolCallError) and '"name"' in calls[3].message
    assert isinstance(calls[4], ToolCallError) and "JSON object" in calls[4].message
    assert isinstance(calls[5], ToolCallError) and "not closed" in calls[5].message
    assert parse_tool_calls("just an answer: 42", "hermes") == []


def test_hermes_list_of_calls_in_one_tag():
    """SmolLM2's function-calling form: one <tool_call> holding a JSON list of calls."""
    text = ('<tool_call>[{"name": "calculator", "arguments": {"expression": "1+2"}}, '
            '{"name": "calculator", "arguments": {"expression": "3*4"}}, 7]</tool_call>')
    calls = parse_tool_calls(text, "hermes")
    assert calls[:2] == [ToolCall("calculator", {"expression": "1+2"}), ToolCall("calculator", {"expression": "3*4"})]
    assert isinstance(calls[2], ToolCallError) and '"name"' in calls[2].message
    assert isinstance(parse_tool_calls("<tool_call>[]</tool_call>", "hermes")[0], ToolCallError)
    out = ToolEnv(["calculator"]).step(text)
    assert [m["content"] for m in out.observation][:2] == ["3", "12"] and out.info["tool_malformed"] == 1


def test_compact_calls():
    calls = parse_tool_calls("@calculator[12*3]x@calculator[4+4]@calculator[1+", "compact", {"calculator": "expression"})
    assert calls[:2] == [ToolCall("calculator", {"expression": "12*3"}), ToolCall("calculator", {"expression": "4+4"})]
    assert isinstance(calls[2], ToolCallError)
    with pytest.raises(ValueError, match="unknown tool-call format"):
        parse_tool_calls("", "xml")


def test_calculator_evaluates_arithmetic_only():
    assert evaluate("123*456") == 56088 and evaluate("-(2+3)**2 // 4") == -7
    assert CALCULATOR.call({"expression": "7/2"}) == "3.5" and CALCULATOR.call({"expression": "6/2"}) == "3"
    for bad in ("__import__('os')", "2**9999", "a+1", "1 if 1 else 2"):
        assert CALCULATOR.call({"expression": bad}).startswith("error:"), bad
    assert CALCULATOR.call({}).startswith("error: calculator needs")


def test_tool_env_answers_calls_and_errors_as_observations():
    env = ToolEnv(["calculator"], tool_format="hermes")
    env.reset({"raw_prompt": "What is 12*3?"})
    assert env.tools[0]["function"]["name"] == "calculator"
    turn = ('<tool_call>{"name": "calculator", "arguments": {"expression": "12*3"}}</tool_call>'
            '<tool_call>{"name": "search", "arguments": {}}</tool_call><tool_call>{oops}</tool_call>')
    out = env.step(turn)
    assert not out.done and [m["role"] for m in out.observation] == ["tool"] * 3
    assert out.observation[0]["content"] == "36" and "unknown tool 'search'" in out.observation[1]["content"]
    assert "not valid JSON" in out.observation[2]["content"]
    assert out.info == {"tool_calls": 3, "tool_errors": 2, "tool_malformed": 1}
    final = env.step("The answer is 36.")
    assert final.done and final.info["tool_calls"] == 0
    assert ToolEnv(["calculator"], tool_format="compact").tools == []  # the compact form is not rendered
    compact = ToolEnv(["calculator"], tool_format="compact").step("@calculator[2*21]@calculator[1/0]")
    assert compact.observation == [{"role": "user", "content": "42;error: ZeroDivisionError: division by zero"}]


def test_guess_number_feedback():
    env = GuessNumberEnv(1, 100)
    env.reset({"raw_prompt": "", "ground_truth": "37"})
    assert env.step("50").observation[0]["content"] == "lower"
    assert env.step("I say 20").observation[0]["content"] == "higher"
    assert env.step("no idea").observation[0]["content"] == "Answer with a number."
    win = env.step("37")
    assert win.done and win.reward == 1.0


def test_registry_and_import_paths():
    assert resolve_agent_env("tools") is ToolEnv and resolve_agent_env("guess_number") is GuessNumberEnv
    assert resolve_agent_env("hybridflow.envs.agent.builtin:GuessNumberEnv") is GuessNumberEnv
    with pytest.raises(ConfigError, match="guess_number"):
        resolve_agent_env("guess_numbr")
    with pytest.raises(ConfigError, match="cannot import"):
        resolve_agent_env("nowhere.module:Env")


# A Hermes-style template (the shape Qwen2.5 / SmolLM2 ship): tools listed in the system
# turn, tool answers in <tool_response> user turns.
HERMES_TEMPLATE = (
    "{% if tools %}<|im_start|>system\nTools:{% for t in tools %}\n{{ t | tojson }}{% endfor %}\n"
    'Call a tool with <tool_call>{"name": ..., "arguments": ...}</tool_call><|im_end|>\n{% endif %}'
    "{% for m in messages %}{% if m.role == 'tool' %}<|im_start|>user\n<tool_response>\n{{ m.content }}\n"
    "</tool_response><|im_end|>\n{% else %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endif %}"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def test_prompt_and_observation_rendered_with_tools():
    tok = build_char_tokenizer()
    tok.add_special_tokens({"additional_special_tokens": ["<|im_start|>", "<|im_end|>"]})
    tok.chat_template = HERMES_TEMPLATE
    r = ChatRenderer(tok)
    env = ToolEnv(["calculator"])
    messages = env.reset({"raw_prompt": "12*3?"})
    prompt = tok.decode(r.prompt(messages, env.tools))
    assert '"name": "calculator"' in prompt and prompt.endswith("<|im_start|>assistant\n")
    call = '<tool_call>{"name": "calculator", "arguments": {"expression": "12*3"}}</tool_call>'
    turn_ids = tok(call + "<|im_end|>", add_special_tokens=False)["input_ids"]
    stop = frozenset([tok.convert_tokens_to_ids("<|im_end|>")])
    assert r.turn_text(turn_ids, stop) == call
    history = messages + [{"role": "assistant", "content": call}]
    obs = env.step(call).observation
    text = tok.decode(r.observation(history, turn_ids, obs, env.tools))
    # the newline the template writes after <|im_end|> belongs to the observation
    assert text == "\n<|im_start|>user\n<tool_response>\n36\n</tool_response><|im_end|>\n<|im_start|>assistant\n"


def test_calculator_task_rows_and_teacher():
    from hybridflow.envs.agent.calculator_task import rl_rows, sft_rows

    rows = rl_rows("test", 20)
    assert rows[0]["extra_info"]["env"] == "tools" and rows[0]["extra_info"]["env_kwargs"]["tool_format"] == "compact"
    a, b = map(int, rows[0]["prompt"][0]["content"].rstrip("=").split("*"))
    assert rows[0]["reward_model"]["ground_truth"] == str(a * b) and 100 <= a <= 999 or a < 100
    pairs = sft_rows(2000, direct_rate=0.2, wrong_op_rate=0.45)
    kinds = [("*" in p["response"]) * 2 + ("+" in p["response"]) for p in pairs]
    shares = [kinds.count(k) / len(kinds) for k in (0, 1, 2)]  # direct, wrong op, correct
    assert shares == pytest.approx([0.2, 0.45, 0.35], abs=0.04)
    env = ToolEnv(["calculator"], tool_format="compact")
    correct = next(p for p in pairs if "*" in p["response"])["response"]
    call = correct.split("</s>")[0]
    answer = correct.rsplit("|>", 1)[1]
    assert env.step(call).observation[0]["content"] == answer


def test_tools_described_in_a_system_message_when_the_template_ignores_them():
    tok = build_char_tokenizer()  # its template has no tools support
    r = ChatRenderer(tok)
    env = ToolEnv(["calculator"])
    messages = r.with_tools(env.reset({"raw_prompt": "12*3?"}), env.tools)
    assert messages[0]["role"] == "system" and '"name": "calculator"' in messages[0]["content"]
    assert "<tool_call>" in messages[0]["content"] and messages[1] == {"role": "user", "content": "12*3?"}
    assert r.with_tools(messages[1:], None) == messages[1:]
    tok.add_special_tokens({"additional_special_tokens": ["<|im_start|>", "<|im_end|>"]})
    tok.chat_template = HERMES_TEMPLATE  # renders tools itself: nothing added
    assert ChatRenderer(tok).with_tools(messages[1:], env.tools) == messages[1:]


def test_gsm8k_agent_rows_and_sft_teacher(tmp_path):
    """GSM8K rows for the calculator agent: the verl row + the tools env; the SFT teacher
    calls the calculator once per annotation, the env parses and answers those calls
    exactly as the teacher's tool messages say, and the response follows the template."""
    import json

    from hybridflow.data.records import read_records
    from hybridflow.envs.agent.gsm8k_task import teacher_messages, write_task

    src = tmp_path / "gsm8k.jsonl"
    answer = "3*4=<<3*4=12>>12 apples, 12/2=<<12/2=6>>6 each.\n#### 6"
    src.write_text(json.dumps({"question": "Tom has 3 bags of 4 apples, shared by 2. How many each?",
                               "answer": answer}) + "\n")
    tok = build_char_tokenizer()  # with a SmolLM2-like template: any role, tools= ignored
    tok.add_special_tokens({"additional_special_tokens": ["<|im_start|>"], "eos_token": "<|im_end|>"})
    tok.chat_template = ("{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
                         "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
    tok.save_pretrained(tmp_path / "tok")
    paths = write_task(src, tmp_path / "out", model_dir=str(tmp_path / "tok"))
    (row,) = read_records(paths["train"])
    assert row["data_source"] == "openai/gsm8k" and row["reward_model"]["ground_truth"] == "6"
    assert row["extra_info"]["env"] == "tools" and row["extra_info"]["env_kwargs"]["tools"] == ["calculator"]
    call, *answers, final = teacher_messages(answer)
    env = ToolEnv(**row["extra_info"]["env_kwargs"])
    assert env.step(call["content"]).observation == answers == [{"role": "tool", "content": "12"},
                                                                 {"role": "tool", "content": "6"}]
    assert final["content"] == "3*4=12 apples, 12/2=6 each.\n#### 6"
    assert teacher_messages("no annotations\n#### 1") == [{"role": "assistant", "content": "no annotations\n#### 1"}]
    (sft,) = read_records(paths["sft"])
    assert sft["prompt"][0]["role"] == "system" and '"name": "calculator"' in sft["prompt"][0]["content"]
    assert sft["response"].startswith(call["content"] + tok.eos_token) and sft["response"].endswith("#### 6")
    with pytest.raises(FileExistsError):
        write_task(src, tmp_path / "out")
