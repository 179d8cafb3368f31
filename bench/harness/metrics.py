"""A Prometheus ``/metrics`` page read by name: the gateway's work gauges, the replicas' counters.

Parsing is prometheus_client's, so labels with quotes, escapes and spaces read as Prometheus reads
them. A benchmark that polls several gateways a few times a second names the metrics it wants
(``only``): lines that start with none of them are dropped before the parser sees them, which makes
a scrape of a gateway's page a few hundredths of a millisecond instead of milliseconds, CPU the
benchmark would otherwise take from the processes it measures.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

import aiohttp
from prometheus_client.parser import text_string_to_metric_families


@dataclass(frozen=True, slots=True)
class Sample:
    name: str
    """As written on the page: a counter's ``_total``, a histogram's ``_bucket`` included."""
    labels: Mapping[str, str]
    value: float


@dataclass(frozen=True, slots=True)
class Page:
    samples: tuple[Sample, ...]

    def values(self, name: str, where: Mapping[str, str] | None = None) -> list[float]:
        """Every sample of ``name`` whose labels include ``where``, in page order."""
        wanted = (where or {}).items()
        return [s.value for s in self.samples if s.name == name and wanted <= s.labels.items()]

    def sum(self, name: str, where: Mapping[str, str] | None = None, missing: float = 0.0) -> float:
        """``name`` summed over its series; ``missing`` when the page has none (NaN makes a renamed
        metric visible instead of reading as zero)."""
        values = self.values(name, where)
        return sum(values) if values else missing

    def max(self, name: str, missing: float = 0.0) -> float:
        return max(self.values(name), default=missing)


def parse(text: str, only: Sequence[str] = ()) -> Page:
    """The samples of ``text``; with ``only``, just those whose name starts with one of them."""
    if only:
        prefixes = tuple(only)
        text = "\n".join(line for line in text.splitlines() if line.startswith(prefixes)) + "\n"
    return Page(
        tuple(
            Sample(sample.name, sample.labels, sample.value)
            for family in text_string_to_metric_families(text)
            for sample in family.samples
        )
    )


async def scrape(
    session: aiohttp.ClientSession, base_url: str, only: Sequence[str] = (), timeout_s: float = 10.0
) -> Page:
    """``base_url``'s ``/metrics``, parsed; a page that does not parse raises."""
    timeout = aiohttp.ClientTimeout(total=timeout_s)
    async with session.get(base_url + "/metrics", timeout=timeout) as response:
        return parse(await response.text(), only)


async def scrape_all(session: aiohttp.ClientSession, urls: Iterable[str], only: Sequence[str] = ()) -> Page:
    """The pages of ``urls`` (replicas of one fleet) as one: sums and maxima run over all of them."""
    pages = [await scrape(session, url, only) for url in urls]
    return Page(tuple(sample for page in pages for sample in page.samples))
