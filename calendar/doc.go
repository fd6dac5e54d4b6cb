// Package calendar reads systemd calendar events (systemd.time(7),
// "CALENDAR EVENTS") and the maintenance windows built on them, for
// `agentd unit put … --window`. It follows systemd 252 so that what an
// operator checks with `systemd-analyze calendar` is what agentd does:
// the same expressions are accepted and refused, the normalized form is
// the same text, and the elapses are the same instants (the tests compare
// all three with the real tool).
//
// # Calendar events
//
//	[WEEKDAYS] [YEAR-]MONTH-DAY [HOUR:MINUTE[:SECOND]] [ZONE]
//
// Weekdays are names, short or long, in any case ("Mon", "tuesday"), in
// lists ("Mon,Wed") and ranges ("Mon..Fri", or "Mon-Fri" as systemd also
// takes). Every other field is "*" (any), a value, a list "1,15", a range
// "1..5", a repetition "0/15" (0, 15, 30, …) or "1..20/5". "~" instead of
// the last "-" counts days from the end of the month: "*-02~01" is the
// last day of February, "Mon *-05~07/1" the last Monday of May. Years of
// two digits are 20xx below 70 and 19xx from 70; years run 1970–2199.
// Seconds may have a fraction (to the microsecond). A missing date is
// *-*-*, a missing time 00:00:00, a missing second 00. "@UNIXTIME" is one
// instant. The shorthands are minutely, hourly, daily, weekly, monthly,
// quarterly, semiannually, yearly and annually (with systemd's spelling
// variants). "now", "today" and other timestamps are not calendar events.
//
// ZONE is "UTC" (any case) or a tz database name ("Europe/Berlin"). With
// no zone, Spec.Next works in the zone of the time it is given. systemd
// also takes the local zone's abbreviation ("CET" on a Berlin machine);
// this package refuses abbreviations, since their meaning would depend on
// the machine, and it refuses the leap-second "right/" zones, whose
// elapses Go's time package cannot compute as glibc does.
//
// # Windows
//
// A window is a calendar event plus a length; it is open from each elapse
// for that length. Two spellings:
//
//	Tue 02:00-04:00 Europe/Berlin            CALENDAR-HH:MM[:SS] [ZONE]
//	Sat *-*-01 00:00 Europe/Berlin for 4h    CALENDAR for DURATION
//
// In the first, the calendar must name one time of day, and an end at or
// before the start is on the next day ("Mon..Fri 22:00-06:00 UTC" is 8 h
// long). The duration is a systemd time span ("4h", "1h 30min"). A window
// without a zone is in UTC, never the machine's local time, since the
// coordinator and the CLI may run on different machines; Window.String
// always names the zone, in the second spelling, and the text before
// " for " is what to paste into `systemd-analyze calendar`. The length is
// elapsed time: a window over a DST change closes an hour earlier or
// later on the clock. Lengths must be more than zero, at most 7 days, and
// shorter than the gap between elapses (else the window would never
// close).
//
// # Differences from systemd
//
// Next reproduces how systemd's search meets DST changes through glibc's
// mktime (which of a repeated wall clock it takes, the stale DST flag,
// the 1000-step limit), checked against systemd-analyze on thousands of
// random expressions. One case is known to differ: in Europe/Dublin,
// whose tz data marks winter as the DST period, on the spring-forward day
// systemd sometimes skips to the next day ("01..09/5:* Europe/Dublin"
// from 00:30 on 2026-03-29 elapses at 06:00 IST here, the next day's
// 01:00 in systemd).
//
// Time zone data is compiled in (time/tzdata), so hosts without
// /usr/share/zoneinfo read windows as the others do.
//
// Everything here is pure (no clock, no I/O besides loading zone data)
// and safe for concurrent use: a Spec and a Window are not changed after
// parsing.
package calendar
