"""Batch jobs: the Files API that holds their input and output, and the Batches APIs
(OpenAI's, and Anthropic's Message Batches) that run them in the slots interactive traffic
leaves idle."""
