/* test_ui_assets.c -- which request paths the dashboard's asset lookup even considers: manifest-style
 * relative names only (no "..", no absolute path, no empty segment, no hidden file, bounded length) */
#include <string.h>

#include "api/ui/ui.h"
#include "tap.h"

int main(void) {
  const char *good[] = {"index.html", "app.js",  "vendor/xterm.mjs", "vendor/xterm-LICENSE.txt",
                        "a/b/c.css",  "x..y.js", "A_b-9.png"};
  const char *bad[] = {"",
                       "..",
                       "../api-key",
                       "vendor/../index.html",
                       "/etc/passwd",
                       "vendor//x.js",
                       "vendor/",
                       ".hidden",
                       "vendor/.x.js",
                       "a/./b.js",
                       "a\\b.js",
                       "a b.js",
                       "a%2e.js",
                       "x.js\n",
                       "\xc3\xa9.js"};
  for (size_t i = 0; i < sizeof(good) / sizeof(good[0]); i++)
    OK(api_ui_asset_name_ok(good[i]), "'%s' may be an asset", good[i]);
  for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++)
    OK(!api_ui_asset_name_ok(bad[i]), "'%s' is never an asset", bad[i]);
  char longname[256];
  memset(longname, 'a', sizeof(longname) - 1);
  longname[sizeof(longname) - 1] = '\0';
  OK(!api_ui_asset_name_ok(longname), "a 255-byte name is too long");
  longname[200] = '\0';
  OK(api_ui_asset_name_ok(longname), "a 200-byte name is not");
  return tap_done();
}
