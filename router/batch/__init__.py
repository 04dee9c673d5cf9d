"""Batch jobs: the Files API that holds their input and output, and (to come) the Batches
APIs that run them in the slots interactive traffic leaves idle."""
