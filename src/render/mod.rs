//! Render: turns the watched stores and the templates into the desired file set
//! (`haproxy.cfg`, maps, general files), each with its checksum.
//!
//! Pure over its inputs: no network, no disk. Built in the render issue (#3).
