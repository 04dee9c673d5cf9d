"""How long answers take: slot holds, speed and length, queue forecasts, TTFT and its objectives."""
