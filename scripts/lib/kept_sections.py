"""Sections of BENCHMARKS.md that scripts other than bench_report.py write.

    python3 kept_sections.py FILE HEADING BODY_FILE INTRO   replaces (or appends) the
                                                            section HEADING of FILE

bench_report.py rewrites the file wholesale; it calls `kept(path)` first and appends what it
returns, so these sections survive a full report.
"""
import sys

# Headings of the sections other scripts own.
KEPT = ("## RLQS on every rule and backend", "## RLQS fleet at Envoy's cadence", "## Regions")


def split(text):
    """The text before the first kept section, and each kept section by heading."""
    head, sections, current = [], {}, None
    for line in text.splitlines(keepends=True):
        if line.rstrip("\n") in KEPT:
            current = line.rstrip("\n")
            sections[current] = [line]
        elif current and line.startswith("## "):
            current = None
            head.append(line)
        elif current:
            sections[current].append(line)
        else:
            head.append(line)
    return "".join(head), {name: "".join(lines) for name, lines in sections.items()}


def kept(path):
    """The kept sections of the file at `path`, as text to append ("" when none)."""
    try:
        with open(path) as f:
            _, sections = split(f.read())
    except FileNotFoundError:
        return ""
    return "".join(sections[name] for name in KEPT if name in sections)


def main():
    path, heading, body_path, intro = sys.argv[1:5]
    with open(path) as f:
        head, sections = split(f.read())
    with open(body_path) as f:
        body = f.read()
    sections[heading] = f"{heading}\n\n{intro}\n\n{body.strip()}\n\n"
    with open(path, "w") as f:
        f.write(head.rstrip("\n") + "\n\n" + "".join(sections[n] for n in KEPT if n in sections))


if __name__ == "__main__":
    main()
