"""The rules of classical verse, in pure Python (no torch, no data pipeline): lines and forms
(`poetry`), 平水韵 rhyme groups and tones (`rhyme`), 格律 patterns, 黏 and 对 (`meter`),
script conversion (`script`) and plan labels (`plan`)."""
