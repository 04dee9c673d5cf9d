"""Client APIs other than OpenAI's, translated to and from chat completions, and the
`Dialect` seam through which a request's answers are rendered in its client's API."""
