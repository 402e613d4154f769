"""Running the order-fulfilment saga: its follower and the simulated payment gateway."""
