"""One request's belongings: auth, body, bounds, waits, positions, refusals, ledger row, log."""
