"""PTX without its debug information (.loc/.file lines, the .debug sections, comments);
with --shift N: the launch parameters numbered N..N+4 (the tail's five scalars in the tree
before) dropped and the later ones renumbered down by 5."""
import re, sys
def normal(text, shift=None):
    text = text.split("\t.section\t.debug")[0]
    out = []
    for line in text.splitlines():
        s = line.split("//")[0].rstrip()
        if not s.strip() or re.match(r"\s*\.(loc|file)\b", s):
            continue
        if shift is not None:
            m = re.search(r"_param_(\d+)", s)
            if m:
                n = int(m.group(1))
                if shift <= n < shift + 5:
                    continue
                if n >= shift + 5:
                    s = s.replace(f"_param_{n}", f"_param_{n - 5}")
        out.append(s)
    # the declarations' trailing commas depend on which parameter is last
    return "\n".join(l.rstrip(",") for l in out)
if __name__ == "__main__":
    import pathlib
    before, after, shift = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2]), (int(sys.argv[3]) if len(sys.argv) > 3 else None)
    same = differ = 0
    for a in sorted(after.glob("*.ptx")):
        b = before / a.name
        if normal(b.read_text(), shift) == normal(a.read_text()):
            same += 1
        else:
            differ += 1; print("DIFFERS", a.name)
    print(f"{same} identical, {differ} differ")
