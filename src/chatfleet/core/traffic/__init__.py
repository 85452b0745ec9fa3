"""A product's own traffic, as a trace: the rows of the trace format and their checks
(`trace`), the trace in columns with its windows, time scales and hour segments (`columns`),
the twin's driver that offers a segment's turns to the fleet (`replay`), what a segment's
replay counts (`tally`) and the search for the fewest replicas (`search`). Pure: the file is
read by chatfleet.data.traffic, the replay runs in chatfleet.twin.trace_fleet."""
