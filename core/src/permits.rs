//! The permit counter behind the fair semaphore (being written).
