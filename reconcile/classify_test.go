package reconcile

import (
	"strings"
	"testing"
)

const base = `[Unit]
Description=web server
Documentation=https://example.com
After=network.target

[Service]
Type=exec
ExecStart=/usr/bin/web --port 80
ExecReload=/bin/kill -HUP $MAINPID
Environment=A=1

[Install]
WantedBy=multi-user.target
`

// edit returns base with old replaced by new (which must occur).
func edit(t *testing.T, old, new string) string {
	t.Helper()
	if !strings.Contains(base, old) {
		t.Fatalf("base has no %q", old)
	}
	return strings.Replace(base, old, new, 1)
}

func one(content string) []File { return []File{{Path: "web.service", Content: []byte(content)}} }

func TestClassify(t *testing.T) {
	mount := "[Mount]\nWhat=/dev/sdb1\nWhere=/data\nType=ext4\nOptions=noatime\n"
	tests := []struct {
		name     string
		unit     string
		old, new []File
		want     ChangeKind
		keys     string // substring of the joined keys, if set
	}{
		// No difference in effect.
		{name: "identical bytes", old: one(base), new: one(base), want: ChangeNone},
		{name: "comment added", old: one(base), new: one("# managed by agentd\n" + base), want: ChangeCosmetic},
		{name: "semicolon comment", old: one(base), new: one(base + "; trailing\n"), want: ChangeCosmetic},
		{name: "blank lines", old: one(base), new: one(strings.ReplaceAll(base, "\n[", "\n\n\n[")), want: ChangeCosmetic},
		{name: "whitespace around =", new: one(edit(t, "Environment=A=1", "Environment = A=1")), want: ChangeCosmetic},
		{name: "section order", new: one("[Service]\nType=exec\nExecStart=/usr/bin/web --port 80\nExecReload=/bin/kill -HUP $MAINPID\nEnvironment=A=1\n[Unit]\nDescription=web server\nDocumentation=https://example.com\nAfter=network.target\n[Install]\nWantedBy=multi-user.target\n"), want: ChangeCosmetic},
		{name: "key order across keys", new: one(edit(t, "Type=exec\nExecStart=/usr/bin/web --port 80", "ExecStart=/usr/bin/web --port 80\nType=exec")), want: ChangeCosmetic},
		{name: "Description", new: one(edit(t, "Description=web server", "Description=the web server")), want: ChangeCosmetic, keys: "[Unit] Description"},
		{name: "Documentation", new: one(edit(t, "Documentation=https://example.com", "Documentation=man:web(8)")), want: ChangeCosmetic},
		{name: "OnFailure", new: one(edit(t, "After=network.target", "After=network.target\nOnFailure=alert.service")), want: ChangeCosmetic},
		{name: "OnSuccess", new: one(edit(t, "After=network.target", "After=network.target\nOnSuccess=done.service")), want: ChangeCosmetic},
		{name: "OnFailureJobMode", new: one(edit(t, "After=network.target", "After=network.target\nOnFailureJobMode=fail")), want: ChangeCosmetic},
		{name: "IgnoreOnIsolate", new: one(edit(t, "After=network.target", "After=network.target\nIgnoreOnIsolate=yes")), want: ChangeCosmetic},
		{name: "StopWhenUnneeded", new: one(edit(t, "After=network.target", "After=network.target\nStopWhenUnneeded=yes")), want: ChangeCosmetic},
		{name: "RefuseManualStart", new: one(edit(t, "After=network.target", "After=network.target\nRefuseManualStart=yes")), want: ChangeCosmetic},
		{name: "RefuseManualStop", new: one(edit(t, "After=network.target", "After=network.target\nRefuseManualStop=yes")), want: ChangeCosmetic},
		{name: "AllowIsolate", new: one(edit(t, "After=network.target", "After=network.target\nAllowIsolate=yes")), want: ChangeCosmetic},
		{name: "CollectMode", new: one(edit(t, "After=network.target", "After=network.target\nCollectMode=inactive-or-failed")), want: ChangeCosmetic},
		{name: "SourcePath", new: one(edit(t, "After=network.target", "After=network.target\nSourcePath=/etc/fstab")), want: ChangeCosmetic},
		{name: "X- key in [Service]", new: one(edit(t, "Environment=A=1", "Environment=A=1\nX-Owner=team-web")), want: ChangeCosmetic},
		{name: "X- section", new: one(base + "[X-Monitoring]\nPage=yes\n"), want: ChangeCosmetic},
		{name: "[X-Agentd] added", new: one(base + "[X-Agentd]\nHealthySec=10\n"), want: ChangeCosmetic},
		{name: "[X-Agentd] changed", old: one(base + "[X-Agentd]\nOnChange=auto\n"), new: one(base + "[X-Agentd]\nOnChange=restart\n"), want: ChangeCosmetic},
		{name: "X-Reload-Triggers added", new: one(edit(t, "Environment=A=1", "Environment=A=1\nX-Reload-Triggers=Environment")), want: ChangeCosmetic},

		// [Install] only.
		{name: "WantedBy changed", new: one(edit(t, "WantedBy=multi-user.target", "WantedBy=graphical.target")), want: ChangeInstall},
		{name: "Alias added", new: one(edit(t, "WantedBy=multi-user.target", "WantedBy=multi-user.target\nAlias=www.service")), want: ChangeInstall},
		{name: "[Install] removed", new: one(strings.Split(base, "[Install]")[0]), want: ChangeInstall},
		{name: "[Install] and Description", new: one(edit(t, "WantedBy=multi-user.target", "WantedBy=graphical.target")), want: ChangeInstall},

		// Reload.
		{name: "ExecReload changed", new: one(edit(t, "ExecReload=/bin/kill -HUP $MAINPID", "ExecReload=/usr/bin/web --reload")), want: ChangeReload, keys: "[Service] ExecReload"},
		{name: "ExecReload added: daemon-reload only", old: one(strings.Replace(base, "ExecReload=/bin/kill -HUP $MAINPID\n", "", 1)), new: one(base), want: ChangeCosmetic},
		{name: "ExecReload removed: daemon-reload only", old: one(base), new: one(strings.Replace(base, "ExecReload=/bin/kill -HUP $MAINPID\n", "", 1)), want: ChangeCosmetic},
		{name: "ExecReload reset to empty: daemon-reload only", old: one(base), new: one(strings.Replace(base, "ExecReload=/bin/kill -HUP $MAINPID\n", "ExecReload=/bin/kill -HUP $MAINPID\nExecReload=\n", 1)), want: ChangeCosmetic},
		{name: "trigger key changed", old: one(edit(t, "Environment=A=1", "Environment=A=1\nX-Reload-Triggers=Environment")), new: one(edit(t, "Environment=A=1", "Environment=A=2\nX-Reload-Triggers=Environment")), want: ChangeReload},
		{name: "trigger as Section.Key", old: one(edit(t, "Environment=A=1", "Environment=A=1\nX-Reload-Triggers=Service.Environment")), new: one(edit(t, "Environment=A=1", "Environment=A=2\nX-Reload-Triggers=Service.Environment")), want: ChangeReload},
		{name: "trigger plus ExecReload", old: one(edit(t, "Environment=A=1", "Environment=A=1\nX-Reload-Triggers=Environment")), new: one(strings.Replace(edit(t, "Environment=A=1", "Environment=A=3\nX-Reload-Triggers=Environment"), "HUP", "USR1", 1)), want: ChangeReload},
		{name: "trigger key plus a non-trigger key", old: one(edit(t, "Environment=A=1", "Environment=A=1\nX-Reload-Triggers=Environment")), new: one(edit(t, "Environment=A=1\n", "Environment=A=2\nX-Reload-Triggers=Environment\nNice=5\n")), want: ChangeRestart},

		// Restart.
		{name: "ExecStart", new: one(edit(t, "--port 80", "--port 81")), want: ChangeRestart, keys: "[Service] ExecStart"},
		{name: "Environment without triggers", new: one(edit(t, "Environment=A=1", "Environment=A=2")), want: ChangeRestart, keys: "[Service] Environment"},
		{name: "Type", new: one(edit(t, "Type=exec", "Type=simple")), want: ChangeRestart},
		{name: "After is not inert", new: one(edit(t, "After=network.target", "After=network-online.target")), want: ChangeRestart},
		{name: "repeated key order matters", old: one(edit(t, "Environment=A=1", "Environment=A=1\nEnvironment=A=2")), new: one(edit(t, "Environment=A=1", "Environment=A=2\nEnvironment=A=1")), want: ChangeRestart},
		{name: "ExecStart reset added", new: one(edit(t, "ExecStart=/usr/bin/web --port 80", "ExecStart=\nExecStart=/usr/bin/web --port 80")), want: ChangeRestart},
		{name: "Description and ExecStart", new: one(strings.Replace(edit(t, "--port 80", "--port 81"), "web server", "web", 1)), want: ChangeRestart, keys: "[Service] ExecStart"},
		{name: "install and restart", new: one(strings.Replace(edit(t, "--port 80", "--port 81"), "multi-user", "graphical", 1)), want: ChangeRestart},
		{name: "unparseable long line is conservative", new: one(base + "Environment=" + strings.Repeat("x", 5000) + "\n"), want: ChangeRestart},

		// Drop-ins take part.
		{name: "drop-in added with effect", new: append(one(base), File{"web.service.d/env.conf", []byte("[Service]\nEnvironment=B=1\n")}), want: ChangeRestart, keys: "[Service] Environment"},
		{name: "drop-in added, only Description", new: append(one(base), File{"web.service.d/doc.conf", []byte("[Unit]\nDescription=web (patched)\n")}), want: ChangeCosmetic},
		{name: "drop-in removed", old: append(one(base), File{"web.service.d/env.conf", []byte("[Service]\nEnvironment=B=1\n")}), new: one(base), want: ChangeRestart},
		{name: "drop-in comment only", old: append(one(base), File{"web.service.d/x.conf", []byte("[Service]\nNice=1\n")}), new: append(one(base), File{"web.service.d/x.conf", []byte("# why\n[Service]\nNice=1\n")}), want: ChangeCosmetic},
		{name: "setting moved from file to drop-in", old: one(base), new: []File{{"web.service", []byte(strings.Replace(base, "Environment=A=1\n", "", 1))}, {"web.service.d/env.conf", []byte("[Service]\nEnvironment=A=1\n")}}, want: ChangeCosmetic},
		{name: "drop-in ExecReload only", new: append(one(base), File{"web.service.d/r.conf", []byte("[Service]\nExecReload=\nExecReload=/usr/bin/web --reload\n")}), want: ChangeReload},

		// Mounts.
		{name: "mount Options only", unit: "data.mount", old: []File{{"data.mount", []byte(mount)}}, new: []File{{"data.mount", []byte(strings.Replace(mount, "noatime", "noatime,ro", 1))}}, want: ChangeMountOpts},
		{name: "mount What", unit: "data.mount", old: []File{{"data.mount", []byte(mount)}}, new: []File{{"data.mount", []byte(strings.Replace(mount, "sdb1", "sdc1", 1))}}, want: ChangeRestart},
		{name: "Options in a service is not a remount", old: one(base), new: one(base + "[Mount]\nOptions=ro\n"), want: ChangeRestart},
	}
	if len(tests) < 40 {
		t.Fatalf("only %d cases", len(tests))
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if tt.old == nil {
				tt.old = one(base)
			}
			if tt.unit == "" {
				tt.unit = "web.service"
			}
			c := Classify(tt.unit, tt.old, tt.new)
			if c.Kind != tt.want {
				t.Fatalf("Classify = %s (%s), want %s", c.Kind, c.Reason(), tt.want)
			}
			if tt.keys != "" && !strings.Contains(strings.Join(c.Keys, ", "), tt.keys) {
				t.Fatalf("keys = %v, want %q among them", c.Keys, tt.keys)
			}
		})
	}
}
