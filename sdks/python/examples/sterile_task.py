"""A small Inspect task on sandboxwich cells: a scripted model (mockllm)
calls bash_session() and text_editor(), and the scorer reads back the files
those tools wrote in the cell.

    SANDBOXWICH_INSPECT_CONFIG=config.json inspect eval examples/sterile_task.py

config.json: {"url": …, "token_file": …, "release": {…}} (SandboxwichConfig).
"""

from __future__ import annotations

import os

from inspect_ai import Task, task
from inspect_ai.dataset import Sample
from inspect_ai.model import ModelOutput, ModelUsage, get_model
from inspect_ai.scorer import CORRECT, INCORRECT, Score, Target, accuracy, scorer
from inspect_ai.solver import TaskState, generate, use_tools
from inspect_ai.tool import bash_session, text_editor
from inspect_ai.util import sandbox

MODEL = "mockllm/model"


def _script(n: int) -> list[ModelOutput]:
    out = []
    for i in range(n):
        out += [
            ModelOutput.for_tool_call(MODEL, "bash_session", {"action": "type_submit", "input": f"echo bash-{i} > /home/cell/bash.txt"}),
            ModelOutput.for_tool_call(MODEL, "text_editor", {"command": "create", "path": "/home/cell/editor.txt", "file_text": f"editor-{i}\n"}),
            ModelOutput.from_content(MODEL, "done"),
        ]
    for o in out:  # explicit usage: mockllm then counts no tokens (tiktoken would download its encoding)
        o.usage = ModelUsage(input_tokens=1, output_tokens=1, total_tokens=2)
    return out


@scorer(metrics=[accuracy()])
def wrote_files():  # type: ignore[no-untyped-def]
    async def score(state: TaskState, target: Target) -> Score:
        bash = await sandbox().read_file("bash.txt")  # relative: the cell's home
        editor = await sandbox().read_file("/home/cell/editor.txt")
        ok = bash.startswith("bash-") and editor.startswith("editor-")
        return Score(value=CORRECT if ok else INCORRECT, explanation=f"{bash!r} {editor!r}")

    return score


@task
def sterile_task(samples: int = 2) -> Task:
    return Task(
        dataset=[Sample(input=f"write the files ({i})", target="ok", id=i) for i in range(samples)],
        solver=[use_tools([bash_session(), text_editor()]), generate()],
        scorer=wrote_files(),
        sandbox=("sandboxwich", os.environ["SANDBOXWICH_INSPECT_CONFIG"]),
        model=get_model(MODEL, custom_outputs=_script(samples)),
    )


@task
def hang_task() -> Task:
    """One sample that holds its cell for ten minutes (to be interrupted)."""
    from inspect_ai.solver import Generate, solver

    @solver
    def hold():  # type: ignore[no-untyped-def]
        async def solve(state: TaskState, generate: Generate) -> TaskState:
            await sandbox().exec(["sleep", "600"], timeout=600)
            return state

        return solve

    return Task(
        dataset=[Sample(input="hold", target="x")],
        solver=[hold()],
        sandbox=("sandboxwich", os.environ["SANDBOXWICH_INSPECT_CONFIG"]),
        model=get_model(MODEL),
    )


@task
def long_task(seconds: int = 24) -> Task:
    """One sample that runs ``seconds`` (longer than the server's maximum
    lease in the test): a command every two seconds, a file written at the
    start and read at the end. It passes only if the provider keeps the
    sample's lease alive."""
    import anyio
    from inspect_ai.solver import Generate, solver

    @solver
    def work():  # type: ignore[no-untyped-def]
        async def solve(state: TaskState, generate: Generate) -> TaskState:
            await sandbox().write_file("start.txt", "started\n")
            end = anyio.current_time() + seconds
            while anyio.current_time() < end:
                r = await sandbox().exec(["sh", "-c", "echo tick >> /home/cell/ticks"], timeout=5)
                assert r.success, r.stderr
                await anyio.sleep(2)
            return state

        return solve

    @scorer(metrics=[accuracy()])
    def ticked():  # type: ignore[no-untyped-def]
        async def score(state: TaskState, target: Target) -> Score:
            start = await sandbox().read_file("start.txt")
            ticks = (await sandbox().read_file("/home/cell/ticks")).count("tick")
            ok = start == "started\n" and ticks >= seconds // 2 - 1
            return Score(value=CORRECT if ok else INCORRECT, explanation=f"{ticks} ticks")

        return score

    return Task(
        dataset=[Sample(input="work", target="x")],
        solver=[work()],
        scorer=ticked(),
        sandbox=("sandboxwich", os.environ["SANDBOXWICH_INSPECT_CONFIG"]),
        model=get_model(MODEL),
    )
