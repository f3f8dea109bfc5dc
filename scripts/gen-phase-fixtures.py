#!/usr/bin/env python3
"""Writes tests/fixtures/phases/: one stream per API with R reasoning token events, C answer
token events and T tool-call token events (tests/phases.rs replays them with a think pause before
the first answer event). The shapes are those of tests/fixtures (see its README) with each API's
reasoning and tool-call fields; `<think>` shapes carry the tags as token events of their own, the
opening one split across two events."""
import json
import os

R, C = 3, 4
OUT = os.path.join(os.path.dirname(__file__), "..", "tests", "fixtures", "phases")
THOUGHTS = [f" step{i}" for i in range(R)]
WORDS = [f" word{i}" for i in range(C)]


def sse(events, crlf=False):
    nl = "\r\n" if crlf else "\n"
    out = []
    for e in events:
        if isinstance(e, tuple):
            kind, data = e
            out.append(f"event: {kind}{nl}data: {json.dumps(data, separators=(',', ':'))}{nl}{nl}")
        elif isinstance(e, str):
            out.append(f"data: {e}{nl}{nl}")
        else:
            out.append(f"data: {json.dumps(e, separators=(',', ':'))}{nl}{nl}")
    return "".join(out)


def chat(field):
    def chunk(delta, finish=None):
        return {"id": "c1", "object": "chat.completion.chunk", "created": 1, "model": "qwen3",
                "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}]}
    ev = [chunk({"role": "assistant", "content": ""})]
    ev += [chunk({field: t}) for t in THOUGHTS]
    ev += [chunk({"content": w}) for w in WORDS]
    ev.append(chunk({"tool_calls": [{"index": 0, "id": "call_1", "type": "function",
                                     "function": {"name": "get_weather", "arguments": ""}}]}))
    ev += [chunk({"tool_calls": [{"index": 0, "function": {"arguments": a}}]})
           for a in ['{"city":', '"Paris"}']]
    ev.append(chunk({}, "tool_calls"))
    ev.append({"id": "c1", "object": "chat.completion.chunk", "created": 1, "model": "qwen3",
               "choices": [], "usage": {"prompt_tokens": 9, "completion_tokens": 12, "total_tokens": 21,
                                        "completion_tokens_details": {"reasoning_tokens": 3}}})
    ev.append("[DONE]")
    return sse(ev)


def chat_tags():
    def chunk(delta, finish=None):
        return {"id": "c2", "object": "chat.completion.chunk", "created": 1, "model": "deepseek-r1",
                "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}
    texts = ["<thi", "nk>"] + THOUGHTS + ["</think>", "\n\n"] + WORDS
    ev = [chunk({"role": "assistant", "content": ""})] + [chunk({"content": t}) for t in texts]
    ev.append(chunk({}, "stop"))
    ev.append("[DONE]")
    return sse(ev)


def completions_tags():
    def chunk(text, finish=None):
        return {"id": "cmpl-1", "object": "text_completion", "created": 1, "model": "deepseek-r1",
                "choices": [{"index": 0, "text": text, "logprobs": None, "finish_reason": finish}]}
    texts = ["<think>"] + THOUGHTS + ["</think>"] + WORDS
    return sse([chunk(t) for t in texts] + [chunk("", "stop"), "[DONE]"])


def responses():
    ev = [("response.created", {"type": "response.created", "sequence_number": 0,
                                 "response": {"id": "resp_1", "object": "response", "status": "in_progress",
                                              "model": "o4-mini", "output": [], "usage": None}})]
    n = 1
    for t in THOUGHTS:
        ev.append(("response.reasoning_summary_text.delta",
                   {"type": "response.reasoning_summary_text.delta", "sequence_number": n,
                    "item_id": "rs_1", "output_index": 0, "summary_index": 0, "delta": t}))
        n += 1
    for w in WORDS:
        ev.append(("response.output_text.delta",
                   {"type": "response.output_text.delta", "sequence_number": n, "item_id": "msg_1",
                    "output_index": 1, "content_index": 0, "delta": w, "logprobs": []}))
        n += 1
    for a in ['{"city":', '"Paris"}']:
        ev.append(("response.function_call_arguments.delta",
                   {"type": "response.function_call_arguments.delta", "sequence_number": n,
                    "item_id": "fc_1", "output_index": 2, "delta": a}))
        n += 1
    ev.append(("response.completed", {"type": "response.completed", "sequence_number": n,
                                      "response": {"id": "resp_1", "status": "completed", "model": "o4-mini",
                                                   "usage": {"input_tokens": 9, "output_tokens": 30,
                                                             "output_tokens_details": {"reasoning_tokens": 21}}}}))
    return sse(ev)


def anthropic():
    ev = [("message_start", {"type": "message_start", "message": {
        "id": "msg_1", "type": "message", "role": "assistant", "model": "claude-sonnet-4-5",
        "content": [], "usage": {"input_tokens": 9, "output_tokens": 1}}})]
    ev.append(("content_block_start", {"type": "content_block_start", "index": 0,
                                       "content_block": {"type": "thinking", "thinking": ""}}))
    ev += [("content_block_delta", {"type": "content_block_delta", "index": 0,
                                    "delta": {"type": "thinking_delta", "thinking": t}}) for t in THOUGHTS]
    ev.append(("content_block_delta", {"type": "content_block_delta", "index": 0,
                                       "delta": {"type": "signature_delta", "signature": "EqQB"}}))
    ev.append(("content_block_stop", {"type": "content_block_stop", "index": 0}))
    ev.append(("content_block_start", {"type": "content_block_start", "index": 1,
                                       "content_block": {"type": "text", "text": ""}}))
    ev += [("content_block_delta", {"type": "content_block_delta", "index": 1,
                                    "delta": {"type": "text_delta", "text": w}}) for w in WORDS]
    ev.append(("content_block_stop", {"type": "content_block_stop", "index": 1}))
    ev.append(("content_block_start", {"type": "content_block_start", "index": 2,
                                       "content_block": {"type": "tool_use", "id": "toolu_1",
                                                         "name": "get_weather", "input": {}}}))
    ev += [("content_block_delta", {"type": "content_block_delta", "index": 2,
                                    "delta": {"type": "input_json_delta", "partial_json": a}})
           for a in ["", '{"city":', '"Paris"}']]
    ev.append(("content_block_stop", {"type": "content_block_stop", "index": 2}))
    ev.append(("message_delta", {"type": "message_delta", "delta": {"stop_reason": "tool_use"},
                                 "usage": {"output_tokens": 30}}))
    ev.append(("message_stop", {"type": "message_stop"}))
    return sse(ev)


def ollama():
    def line(message, done=False, **extra):
        d = {"model": "qwen3", "created_at": "2025-06-01T00:00:00Z", "message": message, "done": done}
        d.update(extra)
        return json.dumps(d, separators=(",", ":")) + "\n"
    out = [line({"role": "assistant", "content": "", "thinking": t}) for t in THOUGHTS]
    out += [line({"role": "assistant", "content": w}) for w in WORDS]
    out.append(line({"role": "assistant", "content": "", "tool_calls": [
        {"function": {"name": "get_weather", "arguments": {"city": "Paris"}}}]}))
    out.append(line({"role": "assistant", "content": ""}, True, done_reason="stop",
                    eval_count=12, prompt_eval_count=9))
    return "".join(out)


def gemini():
    def chunk(parts, finish=None, usage=None):
        cand = {"content": {"parts": parts, "role": "model"}, "index": 0}
        if finish:
            cand["finishReason"] = finish
        d = {"candidates": [cand], "modelVersion": "gemini-2.5-flash", "responseId": "r1"}
        if usage:
            d["usageMetadata"] = usage
        return d
    ev = [chunk([{"text": t, "thought": True}]) for t in THOUGHTS]
    ev += [chunk([{"text": w}]) for w in WORDS]
    ev.append(chunk([{"functionCall": {"name": "get_weather", "args": {"city": "Paris"}}}], "STOP",
                    {"promptTokenCount": 9, "candidatesTokenCount": 12, "thoughtsTokenCount": 40}))
    return sse(ev, crlf=True)


def tgi_tags():
    texts = ["<think>"] + THOUGHTS + ["</think>"] + WORDS
    ev = [{"index": i + 1, "token": {"id": 100 + i, "text": t, "logprob": -0.1, "special": False},
           "generated_text": None, "details": None} for i, t in enumerate(texts)]
    ev.append({"index": len(texts) + 1, "token": {"id": 2, "text": "</s>", "logprob": -0.1, "special": True},
               "generated_text": "".join(texts), "details": None})
    return sse(ev)


def llamacpp_tags():
    texts = ["<think>"] + THOUGHTS + ["</think>"] + WORDS
    ev = [{"index": 0, "content": t, "tokens": [], "stop": False, "id_slot": 0, "tokens_predicted": i + 1,
           "tokens_evaluated": 9} for i, t in enumerate(texts)]
    ev.append({"index": 0, "content": "", "tokens": [], "id_slot": 0, "stop": True, "model": "qwen3",
               "tokens_predicted": len(texts), "tokens_evaluated": 9, "stop_type": "eos"})
    return sse(ev)


def sglang_tags():
    texts = ["<think>"] + THOUGHTS + ["</think>"] + WORDS
    ev = []
    for i in range(len(texts)):
        ev.append({"text": "".join(texts[: i + 1]), "meta_info": {
            "id": "s1", "prompt_tokens": 9, "completion_tokens": i + 1, "finish_reason": None}})
    return sse(ev + ["[DONE]"])


FILES = {
    "openai_chat_reasoning_content.sse": chat("reasoning_content"),
    "openai_chat_reasoning.sse": chat("reasoning"),
    "openai_chat_think_tags.sse": chat_tags(),
    "openai_completions_think_tags.sse": completions_tags(),
    "responses_reasoning_summary.sse": responses(),
    "anthropic_thinking.sse": anthropic(),
    "ollama_thinking.ndjson": ollama(),
    "gemini_thoughts.sse": gemini(),
    "tgi_think_tags.sse": tgi_tags(),
    "llamacpp_think_tags.sse": llamacpp_tags(),
    "sglang_think_tags.sse": sglang_tags(),
}

if __name__ == "__main__":
    os.makedirs(OUT, exist_ok=True)
    for name, body in FILES.items():
        with open(os.path.join(OUT, name), "w", newline="") as f:
            f.write(body)
