"""Knowledge retrieval (issue 37): BM25 over SQLite FTS5, as a bot's index does it.

No public question-answer set ships inside a package that installs here (those of ir_datasets
and BEIR are downloaded at run time, which this workplace does not allow), so the set is
synthetic and made the same on every run (seeded): Markdown files of sections (a heading of
three topic words, a body of 60 words drawn from a Zipf vocabulary of 30,000 made-up words),
and questions that each target one section: one heading word, three of its body's rarer words,
and two common words as noise, shuffled. Recall@5 and MRR measure how often and how high BM25
ranks the target; with made-up words there are no synonyms or paraphrases, so they are an
upper bound for lexical search, not a figure for real questions — the timings are the point.

Per size (passages): the time to index from the files (`chatrun index`'s path: read, cut at
headings, insert), the time of a refresh with nothing changed (hashing every file), and the
time per query through `Library.search` (a connection, the FTS5 MATCH, BM25, top 5), median
and 95th percentile.

BM25 vs hybrid (`--hybrid`, at the first size): the same corpus with `embeddings:`, embedded
through chatrun.testing.fake_openai's `/embeddings` (a hashed bag of words, 1,536 dimensions as
text-embedding-3-small's) by the real `openai` client, on two question sets: the questions
above, and the same questions *paraphrased* — each rare body word replaced by a made-up synonym
the corpus never holds (the fake embeds it as the word it stands for), with no heading word —
which BM25 can only find through the two common noise words. The fake gives the 100 most common
words no meaning (a bag of words without that ranks by them; real models discount such words). Time per query includes the query's
own /embeddings round trip to the local fake and the cosine ranking over every vector (numpy when installed).

Vectors (`--vectors`): the cosine ranking alone (`KnowledgeIndex.nearest`: the 50 nearest
passages, and their rows), fast (numpy, one float32 matrix) against pure Python, at each size.
Passages and their vectors (seeded random unit vectors of 1,536 dimensions: a brute-force
ranking costs the same whatever the vectors hold) are written straight into an index file, as
`chatrun index` would leave it. CPU time (process_time) per query, the two ways interleaved
round by round (which goes first alternates), min and median over the rounds; the pure-Python
way asks fewer queries at large sizes (seconds each). Also: reading the vectors from the file
into memory (once per process and per change), and a check that both ways rank alike.

With `--store postgresql://…`, the same sizes on the index shared by replicas in PostgreSQL
(chatrun.knowledge.pg_index: tsvector, GIN, ts_rank x IDF), in that database (each size its own bot).

    python bench/bench_knowledge.py [--sizes 1000 100000] [--queries 300] [--hybrid] [--store URL]
    python bench/bench_knowledge.py --vectors [--sizes 1000 100000] [--rounds 5] [--queries 20]
"""

from __future__ import annotations

import argparse
import itertools
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "runner"))

from chatrun.definition.config import KnowledgeSource  # noqa: E402
from chatrun.knowledge import Library, open_index  # noqa: E402

SECTIONS_PER_FILE = 20
BODY_WORDS = 60
VOCABULARY = 30_000


def vocabulary(rng: random.Random) -> list[str]:
    syllables = [c + v for c in "bcdfghjklmnprstvz" for v in "aeiou"]
    words: set[str] = set()
    while len(words) < VOCABULARY:
        words.add("".join(rng.choice(syllables) for _ in range(rng.randint(2, 4))) + rng.choice("xqw"))
    return sorted(words)  # the x/q/w ending keeps Porter's stemmer from folding two words into one


def make_corpus(folder: Path, passages: int, seed: int) -> list[tuple[str, list[str], list[str]]]:
    """Files of sections; returns each section's (ref, heading words, body words)."""
    rng = random.Random(seed)
    words = vocabulary(rng)
    cumulative = list(itertools.accumulate(1 / (rank + 1) ** 1.07 for rank in range(VOCABULARY)))
    sections: list[tuple[str, list[str], list[str]]] = []
    for number in range(0, passages, SECTIONS_PER_FILE):
        name = f"article-{number // SECTIONS_PER_FILE:05d}.md"
        lines = [f"# Article {number // SECTIONS_PER_FILE}", ""]
        for _ in range(min(SECTIONS_PER_FILE, passages - number)):
            heading = rng.sample(words[500:], 3)
            body = rng.choices(words, cum_weights=cumulative, k=BODY_WORDS)
            anchor = "-".join(heading)
            lines += [f"## {' '.join(heading)}", "", " ".join(body) + ".", ""]
            sections.append((f"{name}#{anchor}", heading, body))
        (folder / name).write_text("\n".join(lines), encoding="utf-8")
    return sections


def make_questions(sections: list[tuple[str, list[str], list[str]]], n: int, seed: int) -> list[tuple[str, str]]:
    rng = random.Random(seed + 1)
    words = vocabulary(random.Random(seed))
    rank = {word: i for i, word in enumerate(words)}
    questions = []
    for ref, heading, body in rng.sample(sections, min(n, len(sections))):
        rare = [w for w in dict.fromkeys(body) if rank[w] > 300] or body
        named = [rng.choice(heading)] if rng.random() < 0.5 else []  # half the questions name no heading word
        chosen = [*named, *rng.sample(rare, min(3, len(rare))), *rng.sample(words[:100], 2)]
        rng.shuffle(chosen)
        questions.append((" ".join(chosen), ref))
    return questions


def paraphrased(questions: list[tuple[str, str]], sections: list[tuple[str, list[str], list[str]]],
                fake: Any) -> list[tuple[str, str]]:
    """The questions with each rare body word replaced by a synonym (`word` + `y`: never in the
    corpus, whose words end in x, q or w) the fake embeds as that word; heading words left out."""
    headings = {ref: set(heading) for ref, heading, _ in sections}
    out = []
    for question, ref in questions:
        words = []
        for word in question.split():
            if word in headings[ref]:
                continue
            if fake is not None and word not in COMMON:
                fake.synonym(word + "y", word)
                word += "y"
            words.append(word)
        out.append((" ".join(words), ref))
    return out


def ask(library: Library, questions: list[tuple[str, str]]) -> dict[str, float]:
    times, ranks = [], []
    for question, target in questions:
        start = time.perf_counter()
        hits = library.search(question, ["docs"], 5)
        times.append(time.perf_counter() - start)
        refs = [hit.ref for hit in hits]
        ranks.append(refs.index(target) + 1 if target in refs else 0)
    times.sort()
    return {"recall_at_5": sum(1 for r in ranks if r) / len(ranks), "mrr": sum(1 / r for r in ranks if r) / len(ranks),
            "query_median_ms": statistics.median(times) * 1000, "query_p95_ms": times[int(len(times) * 0.95) - 1] * 1000}


def hybrid(size: int, queries: int, seed: int) -> list[tuple[str, str, dict[str, float]]]:
    """(ranking, question set, figures) for BM25 and hybrid, plain and paraphrased questions."""
    from chatrun.definition.config import ModelConfig
    from chatrun.testing.fake_openai import FakeOpenAI

    rows = []
    with tempfile.TemporaryDirectory() as tmp, FakeOpenAI() as fake:
        fake.embedding_dimensions = 1536
        root = Path(tmp)
        (root / "docs").mkdir()
        sections = make_corpus(root / "docs", size, seed)
        plain = make_questions(sections, queries, seed)
        COMMON.update(vocabulary(random.Random(seed))[:100])
        for word in COMMON:  # the model gives the most common words no meaning, as real ones nearly do
            fake.synonym(word, "")
        model = ModelConfig(name="gpt-4o-mini", base_url=fake.base_url)
        bm25 = Library(root, {"docs": KnowledgeSource("docs", "docs")})
        bm25.refresh()
        both = Library(root, {"docs": KnowledgeSource("docs", "docs", embeddings="text-embedding-3-small")}, model)
        start = time.perf_counter()
        done = both.refresh()
        print(f"embedded {done.embedded:,} passages in {time.perf_counter() - start:.2f} s "
              f"({both.embedder.requests} requests)", flush=True)
        reworded = paraphrased(plain, sections, fake)
        for name, questions in (("plain", plain), ("paraphrased", reworded)):
            rows.append(("bm25", name, ask(bm25, questions)))
            rows.append(("hybrid", name, ask(both, questions)))
    return rows


COMMON: set[str] = set()
DIMENSIONS = 1536  # text-embedding-3-small's
MODEL = "text-embedding-3-small"


def vector_index(folder: Path, size: int, seed: int) -> Path:
    """An index file of `size` passages with a vector each, written directly (fast to make)."""
    import numpy as np

    from chatrun.knowledge import KnowledgeIndex, index_path
    from chatrun.knowledge.index import source_tag

    path = index_path(folder)
    KnowledgeIndex(path).refresh([], ["docs"])  # the schema
    rng = np.random.default_rng(seed)
    with KnowledgeIndex(path).connect() as db:
        db.execute("BEGIN")
        for start in range(0, size, 10_000):
            count = min(10_000, size - start)
            matrix = rng.standard_normal((count, DIMENSIONS), dtype=np.float32)
            matrix /= np.linalg.norm(matrix, axis=1, keepdims=True)
            passages = [(f"article-{(start + i) // 20:05d}.md", f"part-{start + i}", f"digest{start + i}")
                        for i in range(count)]
            db.executemany("INSERT INTO passages(source, path, anchor, title, tag, heading, body, digest) VALUES "
                           "('docs', ?, ?, 'A title', ?, 'A heading', 'Some text of the passage.', ?)",
                           [(file, anchor, source_tag("docs"), digest) for file, anchor, digest in passages])
            db.executemany("INSERT INTO vectors VALUES (?, ?, ?)",
                           [(MODEL, digest, row.tobytes()) for (_, _, digest), row in zip(passages, matrix, strict=True)])
        db.execute("INSERT OR REPLACE INTO meta VALUES ('vectors', '1')")
        db.execute("COMMIT")
    db.close()
    return path


def timed(way: Any, queries: list[Any]) -> float:
    """CPU seconds per query of `way.nearest` over `queries`."""
    start = time.process_time()
    for query in queries:
        way.nearest(MODEL, query, ["docs"], 50)
    return (time.process_time() - start) / len(queries)


def vectors_bench(size: int, rounds: int, queries: int, seed: int) -> dict[str, float]:
    """Fast against pure Python at `size` passages: CPU ms per query (min, median of `rounds`),
    and the seconds reading the vectors into memory takes each way."""
    from chatrun.knowledge import KnowledgeIndex
    from chatrun.knowledge.vectors import unit

    rng = random.Random(seed)
    with tempfile.TemporaryDirectory() as tmp:
        path = vector_index(Path(tmp), size, seed)
        fast, pure = KnowledgeIndex(path), KnowledgeIndex(path, fast=False)
        loads = {}
        for name, way in (("fast", fast), ("pure", pure)):
            start = time.process_time()
            assert way.vectors(MODEL).size == size
            loads[name] = time.process_time() - start
        asked = [unit([rng.gauss(0, 1) for _ in range(DIMENSIONS)]) for _ in range(queries)]
        few = asked[:max(1, queries * 1000 // size)]
        assert [h.ref for h in fast.nearest(MODEL, few[0], ["docs"], 10)] == [
            h.ref for h in pure.nearest(MODEL, few[0], ["docs"], 10)]
        per: dict[str, list[float]] = {"fast": [], "pure": []}
        for number in range(rounds):
            order = [("fast", fast, asked), ("pure", pure, few)]
            for name, way, these in order if number % 2 == 0 else reversed(order):
                per[name].append(timed(way, these))
    return {"passages": size, "fast_load_s": loads["fast"], "pure_load_s": loads["pure"],
            "fast_min_ms": min(per["fast"]) * 1000, "fast_median_ms": statistics.median(per["fast"]) * 1000,
            "pure_min_ms": min(per["pure"]) * 1000, "pure_median_ms": statistics.median(per["pure"]) * 1000,
            "pure_queries": len(few)}


def run(size: int, queries: int, seed: int, store: str | None = None) -> dict[str, float]:
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        (root / "docs").mkdir()
        sections = make_corpus(root / "docs", size, seed)
        questions = make_questions(sections, queries, seed)
        sources = {"docs": KnowledgeSource("docs", "docs")}
        name = f"bench-{size}-{seed}-{time.time_ns()}"  # a bot of its own in a shared database
        library = Library(root, sources, index=open_index(root, name, store))
        start = time.perf_counter()
        done = library.refresh()
        indexed = time.perf_counter() - start
        assert done.passages == size, (done.passages, size)
        again = Library(root, sources, index=open_index(root, name, store))
        start = time.perf_counter()
        assert again.refresh().changed == 0
        unchanged = time.perf_counter() - start
        again.close()
        asked = ask(library, questions)
        library.close()
    return {"passages": size, "index_s": indexed, "passages_per_s": size / indexed,
            "unchanged_refresh_s": unchanged, **asked}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[1000, 100_000])
    parser.add_argument("--queries", type=int, default=300)
    parser.add_argument("--seed", type=int, default=37)
    parser.add_argument("--hybrid", action="store_true", help="BM25 vs hybrid at the first size, and only that")
    parser.add_argument("--vectors", action="store_true", help="the cosine ranking, fast (numpy) vs pure Python")
    parser.add_argument("--rounds", type=int, default=5, help="--vectors: rounds of each way, interleaved")
    parser.add_argument("--store", default=None, metavar="URL",
                        help="postgresql://…: the index shared by replicas, in that database (default: SQLite files)")
    args = parser.parse_args()
    if args.vectors:
        print(f"{'passages':>9} {'load fast s':>11} {'load pure s':>11} {'fast min ms':>11} {'fast med ms':>11} "
              f"{'pure min ms':>11} {'pure med ms':>11} {'pure q':>6}  (CPU, {args.rounds} rounds)")
        for size in args.sizes:
            r = vectors_bench(size, args.rounds, min(args.queries, 20), args.seed)
            print(f"{r['passages']:>9,} {r['fast_load_s']:>11.2f} {r['pure_load_s']:>11.2f} {r['fast_min_ms']:>11.2f} "
                  f"{r['fast_median_ms']:>11.2f} {r['pure_min_ms']:>11.1f} {r['pure_median_ms']:>11.1f} "
                  f"{r['pure_queries']:>6}", flush=True)
        return
    if args.hybrid:
        print(f"{'ranking':>8} {'questions':>12} {'R@5':>6} {'MRR':>6} {'q med ms':>9} {'q p95 ms':>9}")
        for ranking, questions, r in hybrid(args.sizes[0], args.queries, args.seed):
            print(f"{ranking:>8} {questions:>12} {r['recall_at_5']:>6.3f} {r['mrr']:>6.3f} "
                  f"{r['query_median_ms']:>9.2f} {r['query_p95_ms']:>9.2f}", flush=True)
        return
    print(f"{'passages':>9} {'index s':>8} {'pass/s':>8} {'no-op s':>8} {'R@5':>6} {'MRR':>6} "
          f"{'q med ms':>9} {'q p95 ms':>9}")
    for size in args.sizes:
        r = run(size, args.queries, args.seed, args.store)
        print(f"{r['passages']:>9,} {r['index_s']:>8.2f} {r['passages_per_s']:>8,.0f} {r['unchanged_refresh_s']:>8.2f} "
              f"{r['recall_at_5']:>6.3f} {r['mrr']:>6.3f} {r['query_median_ms']:>9.2f} {r['query_p95_ms']:>9.2f}",
              flush=True)


if __name__ == "__main__":
    main()
