"""How the CLI's long commands (bench, doctor) take a termination. Owns: SIGTERM and SIGHUP raised as Ctrl-C's
KeyboardInterrupt, so that each takes the path that stops what the command started (the drive's probe, a training
child) instead of leaving it running."""
import signal
from typing import Any, Dict


def _raise_keyboard_interrupt(signum, frame):
    raise KeyboardInterrupt(f"signal {signum}")


def interrupting_signals() -> Dict[int, Any]:
    """SIGTERM and SIGHUP raise KeyboardInterrupt from now on (Ctrl-C's path: what the command started is stopped);
    returns the handlers they replaced. Not a signal ignored: under nohup a closed terminal must not stop the
    command (helper-219)."""
    return {number: signal.signal(number, _raise_keyboard_interrupt)
            for number in (signal.SIGTERM, signal.SIGHUP) if signal.getsignal(number) != signal.SIG_IGN}


def restore_signals(previous: Dict[int, Any]) -> None:
    for number, handler in previous.items():
        signal.signal(number, handler)
