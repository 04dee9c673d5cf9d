"""Where and when one request runs: admission, steering, failover, objective, replica pick."""
