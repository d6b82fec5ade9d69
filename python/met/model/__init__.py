"""The model side: configuration, the paged torch forward, its dense reference and the sampler."""
