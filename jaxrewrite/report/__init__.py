"""What a rewrite tells its user: records of applied and declined rewrites, and the logger."""
