"""What the Python benchmarks share: percentiles and the Markdown table."""


def pct(samples, p):
    s = sorted(samples)
    return s[min(len(s) - 1, int(p / 100 * len(s)))]


def table(header, rows):
    widths = [max(len(str(r[i])) for r in [header] + rows) for i in range(len(header))]
    line = lambda r: "| " + " | ".join(str(v).ljust(w) for v, w in zip(r, widths)) + " |"
    print(line(header))
    print("|" + "|".join("-" * (w + 2) for w in widths) + "|")
    for r in rows:
        print(line(r))
