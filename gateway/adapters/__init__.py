"""Platform adapters: each turns platform events into InboundMessage and OutboundMessage
into API calls, and nothing else."""
