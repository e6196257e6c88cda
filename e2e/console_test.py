"""The web console in headless Chromium against a running `asyncd dev` (e2e/console.sh).

Every step waits for a condition with a deadline (WebDriverWait, or `until` on the API),
never for a fixed time, and every change made in the browser is checked through the API.
Screenshots of each page go to --out.
"""

import argparse
import json
import pathlib
import shutil
import time
import urllib.error
import urllib.request

from selenium import webdriver
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.support import expected_conditions as EC
from selenium.webdriver.support.ui import Select, WebDriverWait

DEADLINE = 20  # seconds, for every wait

# A payload that would show an image (and change the title) if the console rendered data
# as HTML.
HOSTILE = '<img id="injected" src="x" onerror="document.title=\'pwned\'">'


class Api:
    def __init__(self, url, token):
        self.url = url
        self.token = token

    def call(self, method, path, body=None, token=True):
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(self.url + path, data=data, method=method)
        request.add_header("Content-Type", "application/json")
        if token:
            request.add_header("Authorization", "Bearer " + self.token)
        try:
            with urllib.request.urlopen(request, timeout=10) as answer:
                return answer.status, dict(answer.headers), json.loads(answer.read() or b"null")
        except urllib.error.HTTPError as error:
            return error.code, dict(error.headers), json.loads(error.read() or b"null")

    def submit(self, body):
        status, _, answer = self.call("POST", "/v1/tasks", body)
        assert status == 201, (status, answer)
        return answer["id"]

    def task(self, id):
        status, _, answer = self.call("GET", "/v1/tasks/" + id)
        assert status == 200, (status, answer)
        return answer

    def job(self, name):
        status, _, answer = self.call("GET", "/v1/jobs/" + name)
        assert status == 200, (status, answer)
        return answer

    def schedule(self, job, name):
        """The schedule's (status, answer): 404 once deleted."""
        status, _, answer = self.call("GET", f"/v1/schedules/{job}/{name}")
        return status, answer


def until(what, check):
    """Polls `check` until it returns something true; fails after DEADLINE naming `what`."""
    deadline = time.monotonic() + DEADLINE
    while True:
        value = check()
        if value:
            return value
        assert time.monotonic() < deadline, "timed out waiting for " + what
        time.sleep(0.1)


def browser():
    options = webdriver.ChromeOptions()
    options.binary_location = shutil.which("chromium")
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu",
                "--window-size=1400,820", "--force-device-scale-factor=1"):
        options.add_argument(arg)
    # Debian's driver, named explicitly: Selenium then fetches nothing.
    return webdriver.Chrome(service=Service(shutil.which("chromedriver")), options=options)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--url", required=True)
    parser.add_argument("--token", required=True)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    out = pathlib.Path(args.out)
    api = Api(args.url, args.token)

    # Every /ui answer forbids inline script; without a token the API refuses.
    status, headers, _ = api.call("GET", "/v1/jobs", token=False)
    assert status == 401, status
    request = urllib.request.Request(args.url + "/ui/")
    with urllib.request.urlopen(request, timeout=10) as answer:
        csp = answer.headers["Content-Security-Policy"]
    assert "script-src 'self'" in csp and "default-src 'none'" in csp, csp
    assert "unsafe-inline" not in csp, csp

    # The tasks the console is to find and act on.
    waiting = api.submit({"type": "charge_invoice", "delay": "1h",
                          "payload": {"invoice": 1041, "note": HOSTILE}})
    for n in range(2):
        api.submit({"type": "charge_invoice", "delay": "2h", "payload": {"invoice": 1042 + n}})
    dead = api.submit({"type": "deliver_webhook", "payload": {"order": 7731}})
    for n in range(12):
        api.submit({"type": "send_report", "payload": {"report": n}})
    until("the webhook task in dead letters", lambda: api.task(dead)["state"] == "dead")

    driver = browser()
    wait = WebDriverWait(driver, DEADLINE)
    css = lambda selector: (By.CSS_SELECTOR, selector)  # noqa: E731
    try:
        # No token yet: the console asks for one.
        driver.get(args.url + "/ui")
        field = wait.until(EC.visibility_of_element_located((By.ID, "token-input")))
        field.send_keys(args.token)
        driver.find_element(By.ID, "token-save").click()

        # Jobs overview: the counts the API holds.
        def cell(job, column):
            return driver.find_element(*css(f'tr[data-job="{job}"] td[data-col="{column}"]')).text

        wait.until(EC.presence_of_element_located(css('tr[data-job="billing-job"]')))
        wait.until(lambda d: cell("billing-job", "scheduled") == "3")
        wait.until(lambda d: cell("webhook-job", "dead") == "1")
        until("the report tasks done", lambda: api.job("report-job")["stats"]["finished_last_minute"]["succeeded"] == 12)
        wait.until(lambda d: cell("report-job", "succeeded") == "12")  # the 5 s refresh

        # Pause the webhook job with its button; the API says it is paused.
        driver.find_element(*css('button.pause[data-job="webhook-job"]')).click()
        until("webhook-job paused", lambda: api.job("webhook-job")["paused"])
        wait.until(EC.element_to_be_clickable(css('button.resume[data-job="webhook-job"]')))
        assert cell("webhook-job", "state") == "paused", cell("webhook-job", "state")
        driver.save_screenshot(str(out / "jobs.png"))

        # Find the waiting task by search and open it.
        driver.find_element(*css('header nav a[data-page="tasks"]')).click()
        form = wait.until(EC.presence_of_element_located((By.ID, "tasks-filters")))
        Select(form.find_element(By.ID, "filter-job")).select_by_value("billing-job")
        Select(form.find_element(By.ID, "filter-state")).select_by_value("pending")
        form.find_element(By.CSS_SELECTOR, 'button[type="submit"]').click()
        wait.until(EC.staleness_of(form))  # the page drawn again with the filter's results
        wait.until(EC.element_to_be_clickable(css(f'#results tr[data-id="{waiting}"] a'))).click()
        payload = wait.until(EC.visibility_of_element_located((By.ID, "task-payload")))
        assert driver.find_element(By.ID, "task-id").text == waiting
        assert json.loads(payload.text)["note"] == HOSTILE, payload.text
        assert "pending" in driver.find_element(By.ID, "task-state").text
        assert not driver.find_elements(By.ID, "injected"), "a payload was rendered as HTML"
        assert driver.title != "pwned"
        driver.save_screenshot(str(out / "task.png"))

        # Redrive the dead letter from the dead-letter page. The job is paused, so the
        # redriven task stays pending for the API to see.
        driver.find_element(*css('header nav a[data-page="dead"]')).click()
        button = wait.until(EC.element_to_be_clickable(css(f'button.redrive[data-id="{dead}"]')))
        driver.save_screenshot(str(out / "dead-letters.png"))
        button.click()
        until("the dead letter redriven", lambda: api.task(dead)["state"] == "pending")
        wait.until(EC.staleness_of(button))
        assert api.task(dead)["attempt"] == 0

        # Resume with its button: the job runs again, and the redriven task with it
        # (its executor is a closed port and it has no retries: dead again, one attempt).
        driver.find_element(*css('header nav a[data-page="jobs"]')).click()
        wait.until(EC.element_to_be_clickable(css('button.resume[data-job="webhook-job"]'))).click()
        until("webhook-job resumed", lambda: not api.job("webhook-job")["paused"])
        until("the redriven task run again",
              lambda: (api.task(dead)["state"], api.task(dead)["attempt"]) == ("dead", 1))
        wait.until(EC.element_to_be_clickable(css('button.pause[data-job="webhook-job"]')))

        # Purge the job's dead letters in bulk: a dry run, a confirmation, then the loop.
        driver.find_element(*css('header nav a[data-page="dead"]')).click()
        bulk = wait.until(EC.presence_of_element_located((By.ID, "bulk-filters")))
        Select(bulk.find_element(By.ID, "bulk-job")).select_by_value("webhook-job")
        driver.find_element(By.ID, "bulk-purge").click()
        alert = wait.until(EC.alert_is_present())
        assert alert.text == "Delete 1 dead letters for good?", alert.text
        alert.accept()
        until("the dead letter purged", lambda: api.call("GET", "/v1/tasks/" + dead)[0] == 404)
        wait.until(EC.text_to_be_present_in_element((By.ID, "notice"), "Purged 1 dead letters."))
        status, _, listing = api.call("GET", "/v1/dead-letters?type=deliver_webhook")
        assert (status, listing["items"]) == (200, []), (status, listing)

        # Cron entries with their next firings.
        driver.find_element(*css('header nav a[data-page="cron"]')).click()
        firings = wait.until(EC.presence_of_all_elements_located(css("ul.firings li time")))
        assert len(firings) == 3, len(firings)
        next_firings = api.job("report-job")["cron"][0]["next"]
        assert [f.get_attribute("datetime") for f in firings] == next_firings
        policies = [td.text for td in driver.find_elements(*css("td.policy"))]
        assert policies == ["skip while running", "30m"], policies
        driver.save_screenshot(str(out / "cron.png"))

        # Schedules. A page of them is 50: 51 (made through the API, paused) take "More".
        for n in range(51):
            status, _, answer = api.call("POST", "/v1/schedules", {
                "job": "billing-job", "name": f"page-{n:03}", "every": "1h", "paused": True})
            assert status == 201, (status, answer)
        driver.find_element(*css('header nav a[data-page="schedules"]')).click()
        rows = css("#schedule-list tbody tr[data-schedule]")
        # The first job by name is shown first.
        wait.until(lambda d: len(d.find_elements(*rows)) == 50)
        assert Select(driver.find_element(By.ID, "schedules-job")).first_selected_option.text == "billing-job"
        wait.until(EC.element_to_be_clickable((By.ID, "schedules-more"))).click()
        wait.until(lambda d: len(d.find_elements(*rows)) == 51)
        wait.until(EC.invisibility_of_element_located((By.ID, "schedules-more")))
        names = [r.get_attribute("data-schedule") for r in driver.find_elements(*rows)]
        assert names == [f"page-{n:03}" for n in range(51)], names

        # The report job: its spec.cron entry is listed, read-only (trigger only), and
        # the API refuses to change it.
        chooser = driver.find_element(By.ID, "schedules-job")
        Select(chooser).select_by_value("report-job")
        wait.until(EC.staleness_of(chooser))
        config_row = wait.until(EC.presence_of_element_located(css('tr[data-schedule="weekly-summary"]')))
        assert config_row.get_attribute("data-source") == "config"
        assert "read-only" in config_row.find_element(*css('td[data-col="source"]')).text
        buttons = [b.get_attribute("class") for b in config_row.find_elements(By.TAG_NAME, "button")]
        assert buttons == ["trigger"], buttons
        assert config_row.find_element(*css('td[data-col="when"]')).text == "CRON_TZ=Europe/Berlin 0 7 * * 1"
        status, _, answer = api.call("POST", "/v1/schedules/report-job/weekly-summary/pause")
        assert (status, answer["error"]["code"]) == (409, "schedule_read_only"), (status, answer)

        # Trigger the config entry with its button: a task of the job appears.
        config_row.find_element(By.CSS_SELECTOR, "button.trigger").click()
        prefix = "Triggered schedule weekly-summary: task "
        wait.until(EC.text_to_be_present_in_element((By.ID, "notice"), prefix))
        fired = driver.find_element(By.ID, "notice").text.removeprefix(prefix).rstrip(".")
        assert api.task(fired)["type"] == "send_report", fired

        # A cron without CRON_TZ: the server's error, naming the field, and nothing made.
        form = driver.find_element(By.ID, "schedule-form")
        form.find_element(By.ID, "schedule-name").send_keys("console-weekly")
        form.find_element(By.ID, "schedule-cron").send_keys("0 7 * * 1")
        payload = {"note": HOSTILE, "schedule": "{{schedule}}"}
        textarea = form.find_element(By.ID, "schedule-payload")
        textarea.clear()
        textarea.send_keys(json.dumps(payload))
        Select(form.find_element(By.ID, "schedule-overlap")).select_by_value("BufferOne")
        form.find_element(By.ID, "schedule-create").click()
        wait.until(EC.text_to_be_present_in_element((By.ID, "schedule-error-field"), "cron"))
        message = driver.find_element(By.ID, "schedule-error-message").text
        assert "CRON_TZ" in message and "invalid_field" in message, message
        assert "invalid" in form.find_element(By.ID, "schedule-cron").get_attribute("class")
        assert api.schedule("report-job", "console-weekly")[0] == 404

        # With its zone it is created, and listed.
        cron = form.find_element(By.ID, "schedule-cron")
        cron.clear()
        cron.send_keys("CRON_TZ=Europe/Berlin 0 7 * * 1")
        form.find_element(By.ID, "schedule-create").click()
        row = css('tr[data-schedule="console-weekly"]')
        wait.until(EC.presence_of_element_located(row))
        wait.until(EC.invisibility_of_element_located((By.ID, "schedule-error")))
        status, created = api.schedule("report-job", "console-weekly")
        assert status == 200, (status, created)
        assert (created["source"], created["cron"], created["overlap"], created["paused"]) == \
            ("api", "CRON_TZ=Europe/Berlin 0 7 * * 1", "BufferOne", False), created
        assert created["payload"] == payload, created["payload"]
        shown = driver.find_element(*row).find_element(*css('td[data-col="payload"]'))
        assert json.loads(shown.get_attribute("title")) == payload, shown.get_attribute("title")
        # The cell shows the payload as JSON text (clipped): the markup in it as written.
        assert shown.text.startswith('{"note":' + json.dumps(HOSTILE)), shown.text
        assert not driver.find_elements(By.ID, "injected"), "a payload was rendered as HTML"
        assert driver.title != "pwned"

        # Pause it: the API says paused, the row offers Resume.
        driver.find_element(*css('button.pause[data-schedule="console-weekly"]')).click()
        until("console-weekly paused", lambda: api.schedule("report-job", "console-weekly")[1]["paused"])
        wait.until(EC.element_to_be_clickable(css('button.resume[data-schedule="console-weekly"]')))
        assert driver.find_element(*row).find_element(*css('td[data-col="state"]')).text == "paused"

        # Trigger it: a task of the job with the schedule's payload, filled in.
        driver.find_element(*css('button.trigger[data-schedule="console-weekly"]')).click()
        prefix = "Triggered schedule console-weekly: task "
        wait.until(EC.text_to_be_present_in_element((By.ID, "notice"), prefix))
        fired = driver.find_element(By.ID, "notice").text.removeprefix(prefix).rstrip(".")

        def listed():
            status, _, page = api.call("GET", "/v1/tasks?job=report-job&limit=1000")
            assert status == 200, (status, page)
            return next((t for t in page["items"] if t["id"] == fired), None)

        task = until("the triggered task listed in its job", listed)
        assert task["type"] == "send_report", task
        assert task["payload"] == {"note": HOSTILE, "schedule": "console-weekly"}, task["payload"]

        # An interval schedule created paused, with an empty payload.
        form = driver.find_element(By.ID, "schedule-form")
        form.find_element(By.ID, "schedule-name").send_keys("console-every")
        form.find_element(By.ID, "schedule-every").send_keys("90s")
        form.find_element(By.ID, "schedule-payload").clear()
        form.find_element(By.ID, "schedule-paused").click()
        form.find_element(By.ID, "schedule-create").click()
        every_row = wait.until(EC.presence_of_element_located(css('tr[data-schedule="console-every"]')))
        assert every_row.find_element(*css('td[data-col="when"]')).text == "every 90s"
        assert every_row.find_element(*css('td[data-col="state"]')).text == "paused"
        status, every = api.schedule("report-job", "console-every")
        assert (status, every["every"], every["paused"], every["overlap"]) == (200, "90s", True, "Allow"), every
        driver.execute_script("window.scrollTo(0, 0)")
        driver.save_screenshot(str(out / "schedules.png"))

        # Delete it, confirmed: gone from the API and from the list.
        doomed = driver.find_element(*row)
        driver.find_element(*css('button.delete[data-schedule="console-weekly"]')).click()
        alert = wait.until(EC.alert_is_present())
        assert "console-weekly" in alert.text, alert.text
        alert.accept()
        until("console-weekly deleted", lambda: api.schedule("report-job", "console-weekly")[0] == 404)
        wait.until(EC.staleness_of(doomed))

        # Forgetting the token: the next call asks for one again.
        driver.find_element(By.ID, "token-button").click()
        wait.until(EC.element_to_be_clickable((By.ID, "token-forget"))).click()
        wait.until(EC.visibility_of_element_located((By.ID, "token-input")))
        assert driver.execute_script("return sessionStorage.length") == 0
    except Exception:
        driver.save_screenshot(str(out / "failure.png"))
        print("page at failure:", driver.current_url)
        print(driver.find_element(By.TAG_NAME, "body").text[:3000])
        raise
    finally:
        driver.quit()


if __name__ == "__main__":
    main()
