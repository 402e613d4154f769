"""Publishing the notification log to Kafka: the publisher, the record envelope, the producer, a reader."""
