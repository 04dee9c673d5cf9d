"""Whether a backend may be tried: how an exchange failed, whose fault, and the circuit breaker."""
