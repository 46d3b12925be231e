#!/usr/bin/env python3
"""Function length (make lint: check-function-length).

Usage: check_function_length.py [FILE...]

No function body of the project's C++ is longer than MAX_BODY_LINES lines (the lines between the
line of its opening brace and the line of its closing brace), as TigerBeetle's tidy enforces: a
longer function is split along its phases. Checked: the .cc/.h files git knows or would add under
daemon/, client/ (not client/python/build, which is generated) and plugins/storage/; given FILEs,
only those. Tests are exempt (a test case reads top to bottom as one scenario).

A function that must stay long is named in ALLOWED below with the reason; nothing is exempt
silently, and an entry whose function is within the limit again (or gone) fails the check too, so
the list only shrinks.

The parse is lexical, not a compiler's: comments, string and character literals (raw strings
too) and preprocessor lines are blanked, then braces are matched. A brace at namespace or class
scope whose head has a parameter list (and no '=' before it) opens a function body; lambdas and
local classes count toward the function around them; other braces at those scopes (class bodies,
enums, initializers) do not.
Prints "path:line: Name is N lines long (the limit is 70)" per finding; exits 1 on any finding,
2 on bad usage.
"""

import os
import re
import subprocess
import sys

MAX_BODY_LINES = 70

# (path, function) -> why it may be longer. The function is named as the check prints it.
ALLOWED = {
    # A data table: one entry per daemon option (name, field, help text, default). Splitting it
    # would only scatter the table the configuration reference is generated from.
    ("daemon/src/options_table.cc", "OptionDefs"): "the options' table (data, not logic)",
    # Being split by issue 37 work (these files are being rewritten there; the entries go with
    # the splits).
    ("client/cpp/examples/ckptd_demo.cc", "main"): "being split by issue 37 work",
    ("client/cpp/src/arena_mapping.cc", "FetchArenaFd"): "being split by issue 37 work",
    ("client/cpp/src/client_save.cc", "SaveSources"): "being split by issue 37 work",
    ("client/cpp/src/gpu_regions.cc", "GpuRegions::Locate"): "being split by issue 37 work",
}

CHECKED_DIRS = ("daemon/", "client/", "plugins/storage/")
EXCLUDED_DIRS = ("client/python/build/",)


def project_files() -> list:
    """The C++ files make lint checks: known to git or untracked and not ignored."""
    out = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard", "--", "*.cc",
         "*.h"],
        check=True, capture_output=True).stdout.decode()
    files = [f for f in out.split("\0") if f]
    return sorted(f for f in files if f.startswith(CHECKED_DIRS) and
                  not f.startswith(EXCLUDED_DIRS) and os.path.exists(f))


def blank(text: str) -> str:
    """`text` with comments, literals and preprocessor lines replaced by spaces (newlines kept)."""
    out = []
    i, n = 0, len(text)
    line_start = True
    while i < n:
        c = text[i]
        if line_start and c in " \t":
            out.append(c)
            i += 1
            continue
        if line_start and c == "#":
            # A preprocessor line, with its continuations.
            while i < n and text[i] != "\n":
                if text[i] == "\\" and i + 1 < n and text[i + 1] == "\n":
                    out.append(" \n")
                    i += 2
                    continue
                out.append(" ")
                i += 1
            continue
        line_start = c == "\n"
        if text.startswith("//", i):
            j = text.find("\n", i)
            j = n if j < 0 else j
            out.append(" " * (j - i))
            i = j
        elif text.startswith("/*", i):
            j = text.find("*/", i + 2)
            j = n if j < 0 else j + 2
            out.append(re.sub(r"[^\n]", " ", text[i:j]))
            i = j
        elif c == '"' or c == "'":
            word = re.search(r"[A-Za-z0-9_]*$", text[max(0, i - 16):i]).group(0)
            if c == "'" and word[:1].isdigit():  # a digit separator: 1'000'000
                out.append(c)
                i += 1
                continue
            if c == '"' and word.endswith("R"):  # a raw string: R"delim( ... )delim"
                open_paren = text.find("(", i)
                close = ")" + text[i + 1:open_paren] + '"'
                j = text.find(close, open_paren)
                j = n if j < 0 else j + len(close)
            else:
                j = i + 1
                while j < n and text[j] != c:
                    j += 2 if text[j] == "\\" else 1
                j += 1
            out.append(c + re.sub(r"[^\n]", " ", text[i + 1:j - 1]) + c)
            i = j
        else:
            out.append(c)
            i += 1
    return "".join(out)


def strip_template(head: str) -> str:
    """`head` without a leading template<...> clause."""
    m = re.match(r"\s*template\s*<", head)
    if not m:
        return head
    depth, i = 1, m.end()
    while i < len(head) and depth:
        depth += {"<": 1, ">": -1}.get(head[i], 0)
        i += 1
    return strip_template(head[i:])


def function_name(head: str) -> str:
    """The name a function head declares: the qualified identifier before its parameter list.
    Macro invocations before it (an ALL_CAPS name: CKPTD_RPC(...) lines at namespace scope) are
    passed over, unless the head is one (PYBIND11_MODULE)."""
    names = []
    depth = 0
    for m in re.finditer(r"(operator\s*(\(\)|[^\s(]+)|[~A-Za-z_][\w:~<>]*)\s*\(|[()]", head):
        if m.group(0) == "(":
            depth += 1
        elif m.group(0) == ")":
            depth -= 1
        else:
            if depth == 0:
                names.append(re.sub(r"\s+", "", m.group(1)))
            depth += 1
    for name in names:
        if not re.fullmatch(r"[A-Z0-9_:]+", name):
            return name
    return names[0] if names else "?"


def scope_kind(head: str) -> str:
    """What a '{' at namespace or class scope opens, from the text before it."""
    h = strip_template(head).strip()
    if re.match(r"(inline\s+)?namespace\b", h) or re.match(r'extern\s*""', h):
        return "namespace"
    if re.match(r"(typedef\s+)?(class|struct|union|enum)\b", h) and "(" not in h:
        return "class"
    if re.search(r"\boperator\b", h):
        return "function"
    first_paren = h.find("(")
    if first_paren < 0 or "=" in h[:first_paren]:
        return "other"
    if re.match(r"(class|struct|union|enum)\b", h):
        return "class"
    # A constructor's member initializer list: a brace after a member's name initializes it; the
    # body's brace follows a ')' or an initializer's '}'.
    depth, close = 0, len(h)
    for i in range(first_paren, len(h)):
        depth += {"(": 1, ")": -1}.get(h[i], 0)
        if depth == 0:
            close = i
            break
    if re.search(r"(?<!:):(?!:)", h[close + 1:]) and not re.search(r"[)}]\s*$", h):
        return "other"
    return "function"


def long_functions(path: str, text: str) -> list:
    """(line, name, body lines) of every function of `text` longer than MAX_BODY_LINES."""
    code = blank(text)
    found = []
    # The scope stack: (kind, line of its '{', name). Kinds: namespace, class, function, other.
    stack = []
    head = []
    line = 1
    for c in code:
        if c == "\n":
            line += 1
            head.append(" ")
            continue
        inside_function = any(k in ("function", "other") for k, _, _ in stack)
        if c == "{":
            if inside_function:
                stack.append(("other", line, ""))
                continue
            h = "".join(head)
            kind = scope_kind(h)
            stack.append((kind, line, function_name(h) if kind == "function" else ""))
            head = []
        elif c == "}":
            if not stack:
                raise ValueError(f"{path}:{line}: unbalanced '}}'")
            kind, start, name = stack.pop()
            body = line - start - 1
            if kind == "function" and body > MAX_BODY_LINES:
                found.append((start, name, body))
            if kind in ("namespace", "class", "function"):
                head = []
            elif not any(k in ("function", "other") for k, _, _ in stack):
                head.append("{}")  # an initializer at namespace or class scope
        elif c == ";" and not inside_function:
            head = []
        elif not inside_function:
            head.append(c)
    if stack:
        raise ValueError(f"{path}:{stack[-1][1]}: unbalanced '{{'")
    return found


def main(argv: list) -> int:
    if any(a.startswith("-") for a in argv[1:]):
        print(__doc__.split("\n\n")[1], file=sys.stderr)
        return 2
    files = argv[1:] or project_files()
    failed = False
    seen = set()
    for path in files:
        with open(path, encoding="utf-8") as f:
            text = f.read()
        try:
            found = long_functions(path, text)
        except ValueError as e:
            print(f"{e} (check-function-length cannot parse this file)")
            failed = True
            continue
        for start, name, body in found:
            if (path, name) in ALLOWED:
                seen.add((path, name))
                continue
            print(f"{path}:{start}: {name} is {body} lines long (the limit is {MAX_BODY_LINES}): "
                  "split it along its phases")
            failed = True
    if len(argv) == 1:
        for (path, name), why in sorted(ALLOWED.items()):
            if (path, name) not in seen:
                print(f"{path}: {name} is allowed to be long ({why}) but is within "
                      f"{MAX_BODY_LINES} lines or gone: remove it from ALLOWED in {argv[0]}")
                failed = True
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
