"""The one way commands write to a terminal: text is shown as written, never interpreted.

Names come from users and their files (a model, a device, a GPU, a topology, a file name): a
name holding `[/x]` must not be read as rich's markup (it crashed `plan` and `rank`), and an
escape sequence from a file must not reach the terminal. `console()` gives a rich Console that
takes no markup, emoji or highlighting and shows every control character as an escape
(`\\x1b`), so no caller has to remember to escape; `printable` does the same for plain text.
"""

from __future__ import annotations

from synth.text import printable  # noqa: F401  (the terminal's escaper; callers import it from here)

PIPED_WIDTH = 160  # piped or captured output: wide enough that no figure is cut


def console(stderr: bool = False, width: int | None = None, piped_width: int | None = PIPED_WIDTH):
    """A rich Console that shows every string as text (see the module docstring); `width`
    fixes the width, else a terminal's own, else `piped_width` when piped."""
    from rich.console import Console

    class _TextConsole(Console):
        def render_str(self, text: str, **options):
            options.update(markup=False, emoji=False, highlight=False)
            return super().render_str(printable(text), **options)

    plain = dict(markup=False, emoji=False, highlight=False, stderr=stderr)
    if width is not None:
        return _TextConsole(width=width, **plain)
    made = _TextConsole(**plain)
    return made if made.is_terminal or piped_width is None else _TextConsole(width=piped_width, **plain)


def interrupt_in_native_call(error: BaseException) -> bool:
    """Ctrl-C that landed while ctypes converted the arguments of a native call (Z3's): ctypes
    turns the KeyboardInterrupt into an ArgumentError naming it."""
    return type(error).__name__ == "ArgumentError" and "KeyboardInterrupt" in str(error)
