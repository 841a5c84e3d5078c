"""A search set sized like a user's: the quick start's 16 built-in prompts plus generated ones, none of them among
the 24 built-in prompts the held-out judging uses.

    python benchmarks/search_prompts.py 128 runs/search-128.txt
    fp8probe sweep smollm2-135m --prompts runs/search-128.txt --max-new-tokens 48 ... --out runs/smollm2-128

The generated prompts are the built-in ones' kinds (arithmetic and word problems, code, explanations, reasoning,
writing), from templates filled with a fixed seed, so the file is the same on every machine.
"""

from __future__ import annotations

import random
import sys
from pathlib import Path

from fp8probe.model.prompts import BUILTIN_PROMPTS

QUICK_START = 16  # `fp8probe sweep` uses the first 16 built-in prompts; the other 24 are the held-out set

CODE = [
    "reverses the words of a sentence",
    "counts the vowels in a string",
    "returns the largest of three numbers",
    "merges two sorted lists into one sorted list",
    "checks whether a number is prime",
    "flattens a list of lists",
    "returns the factorial of n recursively",
    "computes the average of a list of numbers",
    "finds the second largest number in a list",
    "converts a temperature from Celsius to Fahrenheit",
    "counts how often each word appears in a text",
    "checks whether two strings are anagrams",
    "returns the greatest common divisor of two numbers",
    "removes every vowel from a string",
    "capitalizes the first letter of every word",
    "sums the digits of an integer",
]
LANGUAGES = ["Python", "JavaScript", "Go", "Rust"]
CONCEPTS = [
    "recursion",
    "a binary search",
    "photosynthesis",
    "inflation",
    "the water cycle",
    "a database index",
    "gradient descent",
    "an API",
    "compound interest",
    "the greenhouse effect",
    "a linked list",
    "supply and demand",
    "a version control system",
    "vaccination",
    "the Pythagorean theorem",
    "caching",
]
AUDIENCES = ["a ten-year-old", "a new programmer", "a busy manager", "a high school student"]
FORMS = ["a short poem", "a two-sentence story", "a haiku", "a short product description", "a polite email"]
TOPICS = ["the ocean", "a rainy morning", "a lost key", "a new bicycle", "moving to a new city", "a library", "autumn"]


def _math(rng: random.Random) -> str:
    a, b, c = rng.randint(11, 99), rng.randint(11, 99), rng.randint(2, 9)
    return rng.choice(
        [
            f"What is {a} times {b}? Show your steps.",
            f"Solve for x: {c}x + {a} = {a + c * b}.",
            f"A car travels {a * c} km in {c} hours. What is its average speed in km per hour?",
            f"If a book costs {a} dollars and is discounted by {c * 5} percent, what is the new price?",
            f"What is {a} percent of {b * 10}?",
            f"A box holds {c} rows of {a} eggs. How many eggs are in {b} boxes?",
            f"Is {a * 2 + 1} a prime number? Explain why or why not.",
            f"What is the sum of the first {a} positive integers?",
        ]
    )


def generated(n: int, seed: int = 0) -> list[str]:
    """n distinct prompts of the built-in kinds, none of them a built-in prompt."""
    rng, out, taken = random.Random(seed), [], set(BUILTIN_PROMPTS)
    kinds = [
        _math,
        lambda r: f"Write a {r.choice(LANGUAGES)} function that {r.choice(CODE)}.",
        lambda r: f"Explain {r.choice(CONCEPTS)} to {r.choice(AUDIENCES)}.",
        lambda r: f"Write {r.choice(FORMS)} about {r.choice(TOPICS)}.",
        lambda r: f"What are two advantages and two drawbacks of {r.choice(CONCEPTS)}? Be brief.",
    ]
    while len(out) < n:  # a kind at random: the arithmetic alone has thousands of prompts, so this ends
        p = rng.choice(kinds)(rng)
        if p not in taken:
            taken.add(p)
            out.append(p)
    return out


def search_prompts(n: int) -> list[str]:
    """The first 16 built-in prompts (the quick start's search set) and n - 16 generated ones."""
    return BUILTIN_PROMPTS[:QUICK_START] + generated(max(0, n - QUICK_START))


if __name__ == "__main__":
    n, path = int(sys.argv[1]), Path(sys.argv[2])
    prompts = search_prompts(n)
    assert not set(prompts) & set(BUILTIN_PROMPTS[QUICK_START:]), "the held-out prompts must stay unseen"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(prompts) + "\n", encoding="utf-8")
    print(f"{len(prompts)} search prompts in {path}")
