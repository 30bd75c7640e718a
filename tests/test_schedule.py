"""The page budget's schedule: a small document is not starved behind books, books share,
and no document starves under a stream of others."""

from __future__ import annotations

import asyncio

from ocrd.documents.schedule import PageBudget, Ticket


async def settle() -> None:
    for _ in range(3):
        await asyncio.sleep(0)


async def hold(budget: PageBudget, ticket: Ticket, pages: int) -> None:
    for _ in range(pages):
        await budget.acquire(ticket)


def test_a_one_page_document_takes_the_next_slot_behind_a_book() -> None:
    async def scenario() -> tuple[bool, bool]:
        budget = PageBudget(8)
        book = budget.ticket(400, arrival=0.0)
        await hold(budget, book, 8)
        book_wants_more = asyncio.create_task(budget.acquire(book))
        await settle()
        scan = budget.ticket(1, arrival=5.0)
        scan_wants_one = asyncio.create_task(budget.acquire(scan))
        await settle()
        budget.release(book)  # one of the book's pages is recognised
        await settle()
        result = scan_wants_one.done(), book_wants_more.done()
        book_wants_more.cancel()
        await settle()
        return result

    scan_served, book_served = asyncio.run(scenario())
    assert scan_served and not book_served


def test_books_share_the_budget_equally() -> None:
    async def scenario() -> list[int]:
        budget = PageBudget(12)
        first = budget.ticket(100, arrival=0.0)
        await hold(budget, first, 12)  # the first book took everything while alone
        others = [budget.ticket(100, arrival=float(n)) for n in range(1, 4)]
        books = [first, *others]
        wanting = {id(book): asyncio.create_task(budget.acquire(book)) for book in books}
        await settle()
        for _ in range(60):  # pages finish one at a time, always one of the biggest holder's
            holder = max(books, key=lambda book: book.in_flight)
            budget.release(holder)
            await settle()
            for book in books:
                if wanting[id(book)].done():
                    wanting[id(book)] = asyncio.create_task(budget.acquire(book))
            await settle()
        for task in wanting.values():
            task.cancel()
        await settle()
        return [book.in_flight for book in books]

    holdings = asyncio.run(scenario())
    assert sum(holdings) == 12
    assert max(holdings) - min(holdings) <= 1


def test_a_book_keeps_progressing_under_a_stream_of_small_documents() -> None:
    """Every step one page finishes and two new one-page scans arrive: more than the
    budget serves. The book, older than all of them, still gets a slot whenever it holds
    none, so it is never starved."""

    async def scenario() -> int:
        budget = PageBudget(4)
        book = budget.ticket(400, arrival=0.0)
        await hold(budget, book, 1)
        held: list[Ticket] = [book]
        for index in range(3):
            scan = budget.ticket(1, arrival=1.0 + index)
            await budget.acquire(scan)
            held.append(scan)
        book_pages = 0
        book_wants = asyncio.create_task(budget.acquire(book))
        arrivals: list[asyncio.Task[None]] = []
        for step in range(200):
            for offset in (0.1, 0.2):
                scan = budget.ticket(1, arrival=10.0 + step + offset)
                task = asyncio.create_task(budget.acquire(scan))
                arrivals.append(task)
                task.add_done_callback(lambda _, s=scan: held.append(s))
            await settle()
            budget.release(held.pop(0))  # the oldest page in flight is recognised
            await settle()
            if book_wants.done():
                book_pages += 1
                held.append(book)
                book_wants = asyncio.create_task(budget.acquire(book))
                await settle()
        for task in [book_wants, *arrivals]:
            task.cancel()
        await settle()
        return book_pages

    assert asyncio.run(scenario()) >= 40  # about one page in every four
