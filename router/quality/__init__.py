"""What a downgrade costs in quality (#33): shadows of downgraded requests on idle primary
slots, the judge's verdicts on them and their place in the ledger."""
