"""What a request costs, and which A/B arm it runs in so that arms' costs can be compared."""
