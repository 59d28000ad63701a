"""The thin Spark adapter: the "sqlsink" data source and its writers."""
