"""What a downgrade costs in quality: the pairwise judge's prompt and verdicts, and their
statistics (non-loss rates with intervals, the table of confidence thresholds)."""
