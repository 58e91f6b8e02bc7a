"""Several `geotrain` command lines run one after another in ONE Python process (`geotrain.cli.main.main(words)`).

A `geotrain train` launch pays about 5 s of CPU before its first step: the launcher's imports (torch, numba) and its
fork server's (torch, dynamo; runtime/launcher.py). The second and later command lines of one process reuse both, so
a test that needs several runs which are not about the launch itself (the reference runs of a resume test, say) runs
them here: the same command lines and code, the workers forks of one fork server (started by the first launch, with
its preload: put an elastic run first, whose adds torchft). Each command line's stdout goes to its own file; stderr
(with a line naming each command line as it starts) to one log file, whose part after that line is the command
line's stderr in `results`. Runs that are about the launch itself (Ctrl-C, exit codes of a launcher, signals) stay
`geotrain` processes.

    python one_interpreter.py COMMANDS.json   # [[words, stdout_path], ...]; writes COMMANDS.json.codes
"""

from __future__ import annotations

import json
import re
import shlex
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path


class OneInterpreter:
    """Start `commands` (geotrain's words, without `geotrain`) in one process, in order, in folder `cwd` (this
    process's where None); `results` waits for them."""

    def __init__(self, commands: Sequence[Sequence[str]], directory: Path, name: str,
                 env: Mapping[str, str] | None = None, cwd: Path | None = None) -> None:
        self.commands = [list(words) for words in commands]
        self.spec = directory / f"{name}.json"
        self.outs = [directory / f"{name}-{i}.out" for i in range(len(commands))]
        self.log = directory / f"{name}.log"
        self.spec.write_text(json.dumps([[words, str(out)] for words, out in zip(self.commands, self.outs)]))
        with self.log.open("w") as log:
            self.process = subprocess.Popen([sys.executable, __file__, str(self.spec)], stdout=subprocess.DEVNULL,
                                            stderr=log, env=None if env is None else dict(env), cwd=cwd)

    def wait(self, timeout_s: float = 500) -> None:
        """Wait for the process to end; killed after `timeout_s`."""
        try:
            self.process.wait(timeout=timeout_s)
        finally:
            if self.process.poll() is None:
                self.process.kill()
                self.process.wait()

    def results(self, timeout_s: float = 500) -> list[subprocess.CompletedProcess]:
        """Each command line's exit code, stdout and stderr (the log from its start line to the next one's); the
        process must end."""
        self.wait(timeout_s)
        log = self.log.read_text()
        assert self.process.returncode == 0, f"{self.spec}: exit {self.process.returncode}\n{log[-3000:]}"
        codes = json.loads(Path(f"{self.spec}.codes").read_text())
        errs = re.split(r"one_interpreter: geotrain .*\n", log)[1:]  # (a start line may follow a worker's half line)
        return [subprocess.CompletedProcess(words, code, out.read_text(), err)
                for words, code, out, err in zip(self.commands, codes, self.outs, errs, strict=True)]


def results_of(processes: Sequence[OneInterpreter]) -> list[list[subprocess.CompletedProcess]]:
    """`results` of each process, once every one has ended (a failed one leaves none running)."""
    for process in processes:
        process.wait()
    return [process.results() for process in processes]


def run_side_by_side(commands: Mapping[str, Sequence[str]], directory: Path,
                     env: Mapping[str, str] | None = None) -> dict[str, dict]:
    """Each named `geotrain` command line (with --json) in a process of its own, all side by side; their parsed
    JSON reports by name, once each has exited 0."""
    processes = {name: OneInterpreter([words], directory, name, env) for name, words in commands.items()}
    reports = {}
    for name, (done,) in zip(processes, results_of(list(processes.values())), strict=True):
        assert done.returncode == 0, f"{name}: exit {done.returncode}\n{done.stderr}"
        reports[name] = json.loads(done.stdout)
    return reports


def _run(spec: Path) -> None:
    from geotrain.cli.main import main
    from geotrain.procs.exit import exit_without_teardown
    from geotrain.procs.rundir import run_directory

    codes = []
    with run_directory():  # as `geotrain` itself: every temporary file under one directory, removed at the end
        for words, out in json.loads(spec.read_text()):
            print(f"one_interpreter: geotrain {shlex.join(words)}", file=sys.stderr, flush=True)
            with open(out, "w") as stream:
                sys.stdout = stream  # the JSON report is written on sys.stdout's descriptor: this file's
                try:
                    code = main(words)
                except SystemExit as exc:  # argparse's refusals
                    code = exc.code if isinstance(exc.code, int) else 2
                finally:
                    sys.stdout = sys.__stdout__
            print(f"one_interpreter: exit {code}", file=sys.stderr, flush=True)
            codes.append(code)
    Path(f"{spec}.codes").write_text(json.dumps(codes))
    exit_without_teardown(0)


if __name__ == "__main__":
    _run(Path(sys.argv[1]))
